// Synthetic models: random bf16 weights of a real model's shape, built in
// memory, for benchmarks (`kettle bench --synthetic llama-3.2-1b`).
#pragma once

#include <string>
#include <vector>

#include "model/model.h"

namespace kettle {

// Random affine-quantized projections and embeddings instead of bf16 ones (bits 0: none).
// Random quantized weights: affine with `bits` (0: none) and `group_size`, or FP8 e4m3
// with 128 × 128 block scales (quant_method fp8, as DeepSeek and Qwen publish).
struct SyntheticQuant {
  int bits = 0;
  int group_size = 64;
  bool fp8 = false;
};

// A preset name (llama-3.2-1b, llama-3.1-8b, qwen3-0.6b, ...) or a path to a config.json.
Model make_synthetic_model(const std::string& preset_or_config, uint64_t seed = 1, SyntheticQuant quant = {});
// The spec of a preset or config.json alone (no weights made), with quant's bits in its
// quantization config.
ModelSpec synthetic_spec(const std::string& preset_or_config, SyntheticQuant quant = {});
std::vector<std::string> synthetic_presets();

}  // namespace kettle
