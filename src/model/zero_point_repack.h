// AWQ's and GPTQ's zero-point integer weights, repacked at load into the affine
// layout the kernels run (tensor/affine_quant.h): w = s · (q − z) = s · q + (−s · z),
// so the scale stays s and the bias is −s · z, kept in f32 where both are exact.
//
// - AWQ (AutoAWQ, GEMM packing): qweight I32 [in, out / 8], eight 4-bit codes of
//   consecutive outputs per word in the order 0 2 4 6 1 3 5 7; qzeros I32
//   [in / group, out / 8] packed alike; scales F16 [in / group, out].
// - GPTQ (AutoGPTQ / GPTQModel, no act-order): qweight I32 [in · bits / 32, out],
//   codes of consecutive inputs from the low bits up; qzeros I32
//   [in / group, out · bits / 32] packed along the outputs; scales F16
//   [in / group, out]; g_idx, when present, must be i / group (act-order is refused).
//   The original format stores z − 1 (checkpoint_format "gptq"); "gptq_v2" stores z.
#pragma once

#include <string>

#include "backend/linear.h"
#include "model/quant_config.h"
#include "model/weight_store.h"

namespace kettle {

// The module at `path` (its .qweight, .qzeros, .scales and optional .g_idx) as an affine
// Linear [out, in] whose tensors the store keeps; errors name the tensor and what it holds.
Linear repack_zero_point(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out,
                         int64_t in);

}  // namespace kettle
