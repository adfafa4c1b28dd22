// What config.json says of a quantized checkpoint.
// - MLX's affine layout (the "quantization" object, mirrored as
//   "quantization_config"): a default {bits, group_size} and per-module overrides
//   keyed by the module's path ("model.layers.0.mlp.down_proj": {"bits": 8,
//   "group_size": 64}, or false for a module left unquantized). As MLX loads it, a
//   module is quantized when the checkpoint holds its `.scales`.
// - AWQ and GPTQ ("quantization_config" with quant_method awq / gptq): integer codes
//   with a zero point per group, w = s · (q − z), which is affine (scale s, bias
//   −s · z): repacked at load (model/zero_point_repack.h). A module is quantized when
//   the checkpoint holds its `.qweight`.
// - FP8 e4m3 (quant_method fp8 with weight_block_size, as Qwen3-*-FP8 and DeepSeek
//   publish; compressed-tensors float-quantized with channel or tensor scales): each
//   F8_E4M3 weight times its scale, widened to bf16 at load (no FP8 kernels yet).
// Other methods (bitsandbytes, …), other MLX modes and variants these loaders cannot read
// (AWQ's GEMV packing, GPTQ's act-order, compressed-tensors' int formats) are refused by name.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace kettle {

struct QuantParams {
  bool quantized = false;  // false: the module stays in its float type
  int bits = 0;
  int group_size = 0;
};

enum class QuantMethod { kNone, kMlxAffine, kAwq, kGptq, kFp8 };

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  QuantParams defaults;                        // quantized == false: the config names no quantization
  std::map<std::string, QuantParams> modules;  // module path → its own params
  bool gptq_stored_zero_minus_one = true;      // GPTQ's original format keeps z − 1 (checkpoint_format "gptq")
  // FP8 e4m3 weights (quant_method fp8, or compressed-tensors' float-quantized): the
  // scale tensor's name beside .weight and the block it covers ({0, 0}: per output row
  // or the whole tensor, from its shape).
  std::string fp8_scale = "weight_scale_inv";
  int fp8_block[2] = {0, 0};

  bool present() const { return defaults.quantized; }
  // The params of module `path` ("model.layers.3.self_attn.q_proj", "lm_head").
  QuantParams for_module(const std::string& path) const;
};

// "affine" (MLX's layout), "awq", "gptq", "fp8"; "none".
const char* quant_method_name(QuantMethod method);

// From config.json (path: for errors). No quantization key: a QuantConfig not present().
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& path);

}  // namespace kettle
