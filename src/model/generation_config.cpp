// generation_config.json parsing (transformers GenerationConfig fields).
#include "model/generation_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "model/config.h"
#include "util/error.h"

namespace kettle {
namespace {

void add_ids(const nlohmann::json& j, const char* key, std::vector<int>& ids) {
  if (!j.contains(key) || j[key].is_null()) return;
  const auto& v = j[key];
  if (v.is_number_integer()) ids.push_back(v.get<int>());
  else if (v.is_array())
    for (auto& e : v)
      if (e.is_number_integer()) ids.push_back(e.get<int>());
}

}  // namespace

GenerationDefaults load_generation_defaults(const std::string& folder) {
  namespace fs = std::filesystem;
  GenerationDefaults d;
  fs::path gen_path = fs::path(folder) / "generation_config.json";
  nlohmann::json config = read_json_file((fs::path(folder) / "config.json").string());
  if (fs::exists(gen_path)) {
    nlohmann::json g = read_json_file(gen_path.string());
    try {
      d.do_sample = g.value("do_sample", false);
      if (g.contains("temperature") && g["temperature"].is_number()) d.temperature = g["temperature"].get<float>();
      if (g.contains("top_k") && g["top_k"].is_number_integer()) d.top_k = g["top_k"].get<int>();
      if (g.contains("top_p") && g["top_p"].is_number()) d.top_p = g["top_p"].get<float>();
      if (g.contains("min_p") && g["min_p"].is_number()) d.min_p = g["min_p"].get<float>();
      if (g.contains("repetition_penalty") && g["repetition_penalty"].is_number())
        d.repetition_penalty = g["repetition_penalty"].get<float>();
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCategory::kInvalidData, "{}: {}", gen_path.string(), e.what());
    }
    add_ids(g, "eos_token_id", d.eos_token_ids);
    if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) d.bos_token_id = g["bos_token_id"].get<int>();
  }
  add_ids(config, "eos_token_id", d.eos_token_ids);
  if (d.bos_token_id < 0 && config.contains("bos_token_id") && config["bos_token_id"].is_number_integer())
    d.bos_token_id = config["bos_token_id"].get<int>();
  std::sort(d.eos_token_ids.begin(), d.eos_token_ids.end());
  d.eos_token_ids.erase(std::unique(d.eos_token_ids.begin(), d.eos_token_ids.end()), d.eos_token_ids.end());
  return d;
}

}  // namespace kettle
