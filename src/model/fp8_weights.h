// FP8 e4m3 weights (quant_method fp8, compressed-tensors float-quantized), widened at
// load to bf16: each value times the scale of its block (weight_scale_inv
// [ceil(out / B0), ceil(in / B1)]), its output row (weight_scale [out, 1]) or the whole
// tensor. No FP8 kernels yet, so an FP8 checkpoint costs bf16 memory.
#pragma once

#include <string>

#include "backend/linear.h"
#include "model/quant_config.h"
#include "model/weight_store.h"

namespace kettle {

// True when the module's weight is stored in FP8.
bool is_fp8_weight(const WeightStore& store, const std::string& path);

// The module at `path` as a dense bf16 Linear [out, in] the store keeps; errors name the
// weight or scale tensor and what it holds.
Linear widen_fp8(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out, int64_t in);

}  // namespace kettle
