// Parsing the quantization keys of config.json (MLX affine; others refused by name).
#include "model/quant_config.h"

#include <nlohmann/json.hpp>

#include "tensor/affine_quant.h"
#include "util/error.h"

namespace kettle {
namespace {

using nlohmann::json;

QuantParams parse_params(const json& j, const std::string& where, const std::string& path) {
  if (!j.contains("bits") || !j["bits"].is_number_integer())
    fail(ErrorCategory::kInvalidData, "{}: {} has no integer 'bits'", path, where);
  if (!j.contains("group_size") || !j["group_size"].is_number_integer())
    fail(ErrorCategory::kInvalidData, "{}: {} has no integer 'group_size'", path, where);
  QuantParams p{true, j["bits"].get<int>(), j["group_size"].get<int>()};
  if (!affine_bits_supported(p.bits))
    fail(ErrorCategory::kUnsupported, "{}: {} has bits {}; affine quantization supports 2, 3, 4, 5, 6 and 8", path,
         where, p.bits);
  if (!affine_group_size_supported(p.group_size))
    fail(ErrorCategory::kUnsupported, "{}: {} has group_size {}; affine quantization supports 32, 64 and 128", path,
         where, p.group_size);
  return p;
}

}  // namespace

QuantParams QuantConfig::for_module(const std::string& path) const {
  auto it = modules.find(path);
  return it != modules.end() ? it->second : defaults;
}

QuantConfig parse_quant_config(const json& c, const std::string& path) {
  QuantConfig config;
  const char* key = c.contains("quantization") ? "quantization" : "quantization_config";
  if (!c.contains(key) || c[key].is_null()) return config;
  const json& q = c[key];
  if (!q.is_object()) fail(ErrorCategory::kInvalidData, "{}: '{}' is not an object", path, key);
  if (q.contains("quant_method")) {
    const std::string method = q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : q["quant_method"].dump();
    fail(ErrorCategory::kUnsupported,
         "{}: {}.quant_method is '{}'; kettle loads MLX affine checkpoints ('quantization' with bits and group_size) "
         "and float ones", path, key, method);
  }
  if (q.contains("mode") && q["mode"] != "affine")
    fail(ErrorCategory::kUnsupported, "{}: {}.mode is {}; kettle loads the affine mode", path, key, q["mode"].dump());
  config.defaults = parse_params(q, std::string("'") + key + "'", path);
  for (const auto& [name, value] : q.items()) {
    if (name == "bits" || name == "group_size" || name == "mode") continue;
    if (value.is_boolean()) {
      config.modules[name] = value.get<bool>() ? config.defaults : QuantParams{};
    } else if (value.is_object()) {
      config.modules[name] = parse_params(value, "'" + std::string(key) + "." + name + "'", path);
    } else {
      fail(ErrorCategory::kInvalidData, "{}: {}.{} is {}; expected an object with bits and group_size, or false", path,
           key, name, value.dump());
    }
  }
  return config;
}

}  // namespace kettle
