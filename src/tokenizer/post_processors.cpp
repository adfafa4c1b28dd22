// tokenizer.json post-processors for a single sequence: TemplateProcessing,
// Roberta/Bert (cls A sep), ByteLevel (offsets only, so ids pass through) and
// Sequence. They run only when add_special_tokens is true, as in HF.
#include <nlohmann/json.hpp>

#include "tokenizer/components.h"
#include "util/error.h"

namespace kettle::tok {
namespace {

using nlohmann::json;

class Template : public PostProcessor {
 public:
  // Each item: ids to insert, or empty for the sequence itself.
  explicit Template(std::vector<std::vector<int32_t>> items) : items_(std::move(items)) {}
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (const auto& item : items_) {
      if (item.empty())
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.begin(), item.end());
    }
    ids = std::move(out);
  }

 private:
  std::vector<std::vector<int32_t>> items_;
};

class PassThrough : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps_) s->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_template(const json& j, const std::string& where) {
  const json& single = j.at("single");
  std::vector<std::vector<int32_t>> items;
  for (const json& piece : single) {
    if (piece.contains("Sequence")) {
      items.emplace_back();
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      const json& specials = j.at("special_tokens");
      if (!specials.contains(name))
        fail(ErrorCategory::kInvalidData, "{}: TemplateProcessing uses \"{}\", missing from its special_tokens", where,
             name);
      auto ids = specials[name].at("ids").get<std::vector<int32_t>>();
      if (ids.empty()) continue;
      items.push_back(std::move(ids));
    } else {
      fail(ErrorCategory::kInvalidData, "{}: TemplateProcessing item {} is neither Sequence nor SpecialToken", where,
           piece.dump());
    }
  }
  return std::make_unique<Template>(std::move(items));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "ByteLevel") return std::make_unique<PassThrough>();
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    // {"sep": ["</s>", 2], "cls": ["<s>", 0]}
    const int32_t cls = j.at("cls").at(1).get<int32_t>();
    const int32_t sep = j.at("sep").at(1).get<int32_t>();
    return std::make_unique<Template>(std::vector<std::vector<int32_t>>{{cls}, {}, {sep}});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const json& step : j.at("processors"))
      if (auto p = make_post_processor(step, where)) steps.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(ErrorCategory::kUnsupported, "{}: post-processor type \"{}\" is not supported", where, type);
}

}  // namespace kettle::tok
