// What config.json says of a quantized checkpoint. MLX's affine layout (the
// "quantization" object, mirrored as "quantization_config"): a default
// {bits, group_size} and per-module overrides keyed by the module's path
// ("model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64}, or false for
// a module left unquantized). As MLX loads it, a module is quantized when the
// checkpoint holds its `.scales`; the config gives its bits and group size.
// Other methods (quant_method awq, gptq, fp8, …) and other MLX modes are refused
// by name.
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

struct QuantConfig {
  QuantParams defaults;                        // quantized == false: the config names no quantization
  std::map<std::string, QuantParams> modules;  // module path → its own params

  bool present() const { return defaults.quantized; }
  // The params of module `path` ("model.layers.3.self_attn.q_proj", "lm_head").
  QuantParams for_module(const std::string& path) const;
};

// From config.json (path: for errors). No quantization key: a QuantConfig not present().
QuantConfig parse_quant_config(const nlohmann::json& config, const std::string& path);

}  // namespace kettle
