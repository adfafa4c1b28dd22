#include "server/json_reader.h"

#include <fmt/format.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "server/api_error.h"

namespace kettle::server {
namespace {

using ordered_json = nlohmann::ordered_json;
using ObjectVector = std::vector<std::pair<const std::string, ordered_json>>;

// A SAX consumer that builds the document itself: keys go to the end of the
// object's vector, and a hash of the open object's keys finds duplicates.
class Builder {
 public:
  explicit Builder(const JsonLimits& limits) : limits_(limits) {}

  ordered_json take() { return std::move(root_); }

  bool null() { return scalar(nullptr); }
  bool boolean(bool v) { return scalar(v); }
  bool number_integer(ordered_json::number_integer_t v) { return scalar(v); }
  bool number_unsigned(ordered_json::number_unsigned_t v) { return scalar(v); }
  bool number_float(ordered_json::number_float_t v, const std::string&) { return scalar(v); }
  bool string(std::string& v) { return scalar(std::move(v)); }
  bool binary(ordered_json::binary_t&) { return scalar(nullptr); }  // not produced by JSON text

  bool start_object(std::size_t) { return open(ordered_json::object()); }
  bool start_array(std::size_t) { return open(ordered_json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    Open& top = stack_.back();
    auto& entries = static_cast<ObjectVector&>(*top.value->get_ptr<ordered_json::object_t*>());
    auto [it, added] = top.keys.try_emplace(k, entries.size());
    if (added) entries.emplace_back(std::move(k), nullptr);
    pending_ = &entries[it->second].second;
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message ends in the detail after "syntax error while parsing value - ".
    std::string what = e.what();
    const size_t dash = what.rfind(" - ");
    if (dash != std::string::npos) what = what.substr(dash + 3);
    throw ApiError(400, fmt::format("the request body is not valid JSON (at byte {}: {})", position, what));
  }

 private:
  struct Open {
    ordered_json* value;
    std::unordered_map<std::string, size_t> keys;  // objects only
  };

  // Where the next value goes: the pending key's slot, the open array's end, or the root.
  ordered_json* slot(ordered_json&& v) {
    if (++values_ > limits_.max_values)
      throw ApiError(400, fmt::format("the request body has more than {} JSON values", limits_.max_values));
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    ordered_json* top = stack_.back().value;
    if (top->is_array()) {
      auto& items = *top->get_ptr<ordered_json::array_t*>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *pending_ = std::move(v);
    return pending_;
  }

  template <typename T>
  bool scalar(T&& v) {
    slot(ordered_json(std::forward<T>(v)));
    return true;
  }

  bool open(ordered_json&& container) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      throw ApiError(400, fmt::format("the request body nests JSON more than {} levels deep", limits_.max_depth));
    stack_.push_back({slot(std::move(container)), {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  ordered_json root_;
  std::vector<Open> stack_;
  ordered_json* pending_ = nullptr;
  size_t values_ = 0;
};

}  // namespace

nlohmann::ordered_json read_json(std::string_view text, const JsonLimits& limits) {
  Builder builder(limits);
  ordered_json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json, true, false);
  return builder.take();
}

}  // namespace kettle::server
