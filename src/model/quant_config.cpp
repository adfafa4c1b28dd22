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

// AWQ (AutoAWQ's GEMM packing) and GPTQ (without act-order): 4-bit (GPTQ also 2 and 8),
// groups of 32, 64 or 128.
QuantConfig parse_zero_point_config(const json& q, const std::string& key, const std::string& path) {
  const std::string method = q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : q["quant_method"].dump();
  const auto refuse = [&](const std::string& what) {
    fail(ErrorCategory::kUnsupported, "{}: {}: {}; kettle loads MLX affine, AWQ (GEMM) and GPTQ checkpoints", path, key, what);
  };
  QuantConfig config;
  if (method == "awq") config.method = QuantMethod::kAwq;
  else if (method == "gptq") config.method = QuantMethod::kGptq;
  else refuse("quant_method '" + method + "' is not supported");
  const std::string where = "'" + key + "'";
  const int bits = q.value("bits", q.value("w_bit", 0));
  const int group = q.value("group_size", q.value("q_group_size", 0));
  json params = {{"bits", bits}, {"group_size", group}};
  if (config.method == QuantMethod::kAwq) {
    if (bits != 4) refuse("AWQ with " + std::to_string(bits) + " bits (AWQ checkpoints are 4-bit)");
    const std::string version = q.value("version", "gemm");
    if (version != "gemm" && version != "GEMM") refuse("AWQ version '" + version + "' (kettle reads the GEMM packing)");
    if (!q.value("zero_point", true)) refuse("AWQ without zero points");
  } else {
    if (bits != 2 && bits != 4 && bits != 8) refuse("GPTQ with " + std::to_string(bits) + " bits (kettle reads 2, 4 and 8)");
    if (q.value("desc_act", false)) refuse("GPTQ with desc_act (act-order groups are not contiguous)");
    const std::string format = q.value("checkpoint_format", "gptq");
    if (format != "gptq" && format != "gptq_v2") refuse("GPTQ checkpoint_format '" + format + "'");
    config.gptq_stored_zero_minus_one = format == "gptq";
  }
  if (group <= 0) refuse("group_size " + std::to_string(group) + " (per-channel scales are not supported yet)");
  config.defaults = parse_params(params, where, path);
  return config;
}

// FP8: quant_method fp8 (weight_block_size [rows, cols], or none: one scale per tensor),
// or compressed-tensors whose weights are 8-bit floats with channel, tensor or block scales.
QuantConfig parse_fp8_config(const json& q, const std::string& key, const std::string& path) {
  const auto refuse = [&](const std::string& what) {
    fail(ErrorCategory::kUnsupported, "{}: {}: {}; kettle loads FP8 e4m3 weights with block, channel or tensor scales",
         path, key, what);
  };
  QuantConfig config;
  config.method = QuantMethod::kFp8;
  config.defaults = {true, 8, 0};
  json block = nullptr;
  if (q["quant_method"] == "fp8") {
    const std::string fmt = q.value("fmt", "e4m3");
    if (fmt != "e4m3") refuse("fmt '" + fmt + "'");
    if (q.contains("weight_block_size")) block = q["weight_block_size"];
  } else {
    const std::string format = q.value("format", "");
    if (format != "float-quantized" && format != "naive-quantized") refuse("compressed-tensors format '" + format + "'");
    if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].size() != 1)
      refuse("compressed-tensors with other than one config group");
    const json& weights = q["config_groups"].begin().value().value("weights", json::object());
    if (weights.value("type", "") != "float" || weights.value("num_bits", 0) != 8)
      refuse("weights of type '" + weights.value("type", std::string("?")) + "' and " +
             std::to_string(weights.value("num_bits", 0)) + " bits");
    const std::string strategy = weights.value("strategy", "");
    if (strategy == "block") block = weights.value("block_structure", json(nullptr));
    else if (strategy != "channel" && strategy != "tensor") refuse("weight strategy '" + strategy + "'");
    config.fp8_scale = "weight_scale";
  }
  if (!block.is_null()) {
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer() ||
        block[0].get<int>() <= 0 || block[1].get<int>() <= 0)
      refuse("block size " + block.dump());
    config.fp8_block[0] = block[0].get<int>();
    config.fp8_block[1] = block[1].get<int>();
  }
  return config;
}

}  // namespace

const char* quant_method_name(QuantMethod method) {
  switch (method) {
    case QuantMethod::kMlxAffine: return "affine";
    case QuantMethod::kAwq: return "awq";
    case QuantMethod::kGptq: return "gptq";
    case QuantMethod::kFp8: return "fp8";
    case QuantMethod::kNone: break;
  }
  return "none";
}

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
  if (q.contains("quant_method") && (q["quant_method"] == "fp8" || q["quant_method"] == "compressed-tensors"))
    return parse_fp8_config(q, std::string(key), path);
  if (q.contains("quant_method")) return parse_zero_point_config(q, std::string(key), path);
  if (q.contains("mode") && q["mode"] != "affine")
    fail(ErrorCategory::kUnsupported, "{}: {}.mode is {}; kettle loads the affine mode", path, key, q["mode"].dump());
  config.method = QuantMethod::kMlxAffine;
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
