#include "model/embedding_spec.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace kettle {

namespace fs = std::filesystem;
using nlohmann::json;

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kNone: return "none";
    case Pooling::kLastToken: return "last-token";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
  }
  return "?";
}

namespace {

std::optional<json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{}: not JSON ({})", path.string(), e.what());
  }
}

// The Pooling module's config: exactly one mode kettle computes, prompts kept in the pool.
Pooling read_pooling(const fs::path& path) {
  const std::optional<json> config = read_json(path);
  if (!config || !config->is_object()) fail(ErrorCategory::kInvalidData, "{}: missing or not an object", path.string());
  static const std::pair<const char*, Pooling> kModes[] = {
      {"pooling_mode_lasttoken", Pooling::kLastToken},
      {"pooling_mode_mean_tokens", Pooling::kMean},
      {"pooling_mode_cls_token", Pooling::kCls}};
  static const char* kUnsupported[] = {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                       "pooling_mode_weightedmean_tokens"};
  for (const char* key : kUnsupported)
    if (config->value(key, false)) fail(ErrorCategory::kUnsupported, "{}: '{}' is not supported", path.string(), key);
  if (!config->value("include_prompt", true))
    fail(ErrorCategory::kUnsupported, "{}: 'include_prompt': false is not supported", path.string());
  std::optional<Pooling> chosen;
  // sentence-transformers 6 writes one string ("pooling_mode": "lasttoken"); earlier
  // versions one flag per mode.
  if (config->contains("pooling_mode")) {
    const json& mode = (*config)["pooling_mode"];
    static const std::pair<const char*, Pooling> kNames[] = {
        {"lasttoken", Pooling::kLastToken}, {"mean", Pooling::kMean}, {"cls", Pooling::kCls}};
    for (const auto& [name, pooling] : kNames)
      if (mode.is_string() && mode.get_ref<const std::string&>() == name) chosen = pooling;
    if (!chosen)
      fail(ErrorCategory::kUnsupported, "{}: pooling_mode {} is not supported (kettle computes lasttoken, mean and cls)",
           path.string(), mode.dump());
  }
  for (const auto& [key, mode] : kModes) {
    if (!config->value(key, false)) continue;
    if (chosen && *chosen != mode) fail(ErrorCategory::kUnsupported, "{}: more than one pooling mode is set", path.string());
    chosen = mode;
  }
  if (!chosen) fail(ErrorCategory::kInvalidData, "{}: no pooling mode is set", path.string());
  return *chosen;
}

void read_prompts(const fs::path& path, EmbeddingSpec& spec) {
  const std::optional<json> config = read_json(path);
  if (!config) return;
  if (config->contains("prompts") && (*config)["prompts"].is_object())
    for (const auto& [name, text] : (*config)["prompts"].items())
      if (text.is_string()) spec.prompts[name] = text.get<std::string>();
  if (config->contains("default_prompt_name") && (*config)["default_prompt_name"].is_string()) {
    spec.default_prompt_name = (*config)["default_prompt_name"].get<std::string>();
    if (!spec.prompts.count(spec.default_prompt_name))
      fail(ErrorCategory::kInvalidData, "{}: default_prompt_name '{}' is not among its prompts", path.string(),
           spec.default_prompt_name);
  }
}

void read_matryoshka(const fs::path& path, EmbeddingSpec& spec) {
  const std::optional<json> config = read_json(path);
  if (!config) return;
  spec.matryoshka = config->value("is_matryoshka", false);
  if (config->contains("matryoshka_dimensions") && (*config)["matryoshka_dimensions"].is_array()) {
    for (const json& d : (*config)["matryoshka_dimensions"])
      if (d.is_number_integer() && d.get<int64_t>() > 0) spec.matryoshka_dimensions.push_back(d.get<int64_t>());
    spec.matryoshka = spec.matryoshka || !spec.matryoshka_dimensions.empty();
  }
}

// The longest input: sentence_bert_config.json's max_seq_length (sentence-transformers
// before 6), else the tokenizer's model_max_length (where 6 keeps it); 0: the model's context.
int64_t read_max_tokens(const fs::path& folder) {
  if (const std::optional<json> bert = read_json(folder / "sentence_bert_config.json"))
    if (bert->contains("max_seq_length") && (*bert)["max_seq_length"].is_number_integer())
      return std::max<int64_t>(0, (*bert)["max_seq_length"].get<int64_t>());
  if (const std::optional<json> tok = read_json(folder / "tokenizer_config.json"))
    if (tok->contains("model_max_length") && (*tok)["model_max_length"].is_number_integer()) {
      const int64_t n = (*tok)["model_max_length"].get<int64_t>();
      if (n > 0 && n < (int64_t{1} << 31)) return n;  // transformers writes ~1e30 for "no limit"
    }
  return 0;
}

}  // namespace

std::optional<EmbeddingSpec> load_embedding_spec(const std::string& folder_name) {
  const fs::path folder(folder_name);
  const std::optional<json> modules = read_json(folder / "modules.json");
  if (!modules) return std::nullopt;
  const std::string where = (folder / "modules.json").string();
  if (!modules->is_array()) fail(ErrorCategory::kInvalidData, "{}: not a list of modules", where);
  EmbeddingSpec spec;
  bool pooled = false;
  for (const json& module : *modules) {
    const std::string type = module.is_object() ? module.value("type", "") : "";
    const std::string path = module.is_object() ? module.value("path", "") : "";
    const std::string name = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
    if (name == "Transformer") {
      if (!path.empty()) fail(ErrorCategory::kUnsupported, "{}: a Transformer module in '{}' (not the folder itself) is not supported", where, path);
    } else if (name == "Pooling") {
      if (path.find("..") != std::string::npos) fail(ErrorCategory::kInvalidData, "{}: module path '{}'", where, path);
      spec.pooling = read_pooling(folder / path / "config.json");
      pooled = true;
    } else if (name == "Normalize") {
      spec.normalize = true;
    } else {
      fail(ErrorCategory::kUnsupported, "{}: module '{}' is not supported (kettle computes Transformer, Pooling "
           "and Normalize)", where, type);
    }
  }
  if (!pooled) return std::nullopt;
  read_prompts(folder / "config_sentence_transformers.json", spec);
  spec.max_tokens = read_max_tokens(folder);
  read_matryoshka(folder / "config.json", spec);
  return spec;
}

}  // namespace kettle
