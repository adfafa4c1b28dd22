#include "server/request_fields.h"

#include "server/json_reader.h"

#include <fmt/format.h>

namespace kettle::server {

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

void bad_field(const std::string& field, const std::string& expected) {
  throw ApiError(400, fmt::format("'{}' must be {}", field, expected), field);
}

const ordered_json* field(const ordered_json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool field_is(const ordered_json& object, const char* name, std::string_view value) {
  if (!object.is_object()) return false;
  auto it = object.find(name);
  return it != object.end() && it->is_string() && it->get_ref<const std::string&>() == value;
}

std::optional<double> number_field(const ordered_json& body, const char* name, double lo, double hi) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, "a number");
  double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad_field(name, fmt::format("a number between {} and {}", lo, hi));
  return x;
}

std::optional<int64_t> int_field(const ordered_json& body, const char* name, int64_t lo, int64_t hi) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  const std::string range = hi == INT64_MAX ? fmt::format("an integer >= {}", lo)
                                            : fmt::format("an integer between {} and {}", lo, hi);
  if (!v->is_number_integer()) bad_field(name, range);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) bad_field(name, range);
  int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad_field(name, range);
  return x;
}

std::optional<bool> bool_field(const ordered_json& body, const char* name) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_field(name, "a boolean");
  return v->get<bool>();
}

std::optional<std::string> string_field(const ordered_json& body, const char* name) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_field(name, "a string");
  return v->get<std::string>();
}

std::vector<std::string> string_list_field(const ordered_json& body, const char* name, size_t max_count) {
  const ordered_json* v = field(body, name);
  if (!v) return {};
  const std::string expected = fmt::format("a string or an array of up to {} strings", max_count);
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array() || v->size() > max_count) bad_field(name, expected);
  std::vector<std::string> out;
  for (const ordered_json& s : *v) {
    if (!s.is_string()) bad_field(name, expected);
    out.push_back(s.get<std::string>());
  }
  return out;
}

std::string cache_salt_field(const ordered_json& body) {
  std::optional<std::string> salt = string_field(body, "cache_salt");
  if (salt && (salt->empty() || salt->size() > 256)) bad_field("cache_salt", "a string of 1 to 256 bytes");
  return salt.value_or("");
}

ordered_json parse_body(const std::string& body) {
  ordered_json json = read_json(body);
  if (!json.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return json;
}

}  // namespace kettle::server
