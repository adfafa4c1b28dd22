// Linear: a projection's weights as the backend reads them — the matrix, the
// scheme it is stored in, an optional bias, and the slot an adapter (LoRA)
// will attach to. Dense f32/f16/bf16 is the one scheme today; quantized
// schemes (scales and zero points beside packed values) come next, and a
// backend refuses a scheme or an adapter it cannot run, by name, rather than
// reading it as something else.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace kettle {

enum class WeightScheme { kDense };

struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out], or empty
  WeightScheme scheme = WeightScheme::kDense;
  const void* adapter = nullptr;  // a low-rank adapter bound to it; none yet

  bool empty() const { return weight.empty(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return weight.dim(1); }
};

// One output of a projection: out (row stride ldo) = x · linearᵀ (+ bias).
struct Projection {
  const Linear* linear;
  float* out;
  int64_t ldo;
};

}  // namespace kettle
