// FP8 e4m3 weights (quant_method fp8, compressed-tensors float-quantized) bound as
// they are stored: the codes, and their block, row or tensor scales as one f32 block
// grid (backend/linear.h's Fp8Scales). A backend without FP8 kernels gets them widened
// to bf16 by the model runner as they load.
#pragma once

#include <string>

#include "backend/linear.h"
#include "model/quant_config.h"
#include "model/weight_store.h"

namespace kettle {

// True when the module's weight is stored in FP8 (its scale beside it, its codes e4m3).
bool is_fp8_weight(const WeightStore& store, const QuantConfig& quant, const std::string& path);

// The module at `path` as an FP8 Linear [out, in]; errors name the weight or scale
// tensor and what it holds.
Linear bind_fp8(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out, int64_t in);

}  // namespace kettle
