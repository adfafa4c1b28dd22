// Linear: a projection's weights as the backend reads them — the matrix, the
// scheme it is stored in, an optional bias, and the slot an adapter (LoRA)
// will attach to. Schemes: dense f32/f16/bf16, and MLX's affine quantization
// (packed codes with a scale and a bias per group: tensor/affine_quant.h). A
// backend refuses a scheme or an adapter it cannot run, by name, rather than
// reading it as something else (Backend::runs says which it runs).
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace kettle {

enum class WeightScheme { kDense, kAffine };

// The affine scheme's parts: weight is then the packed codes (U32, [out, in · bits / 32]).
struct AffineScales {
  Tensor scales;  // [out, in / group_size]
  Tensor biases;  // [out, in / group_size]
  int bits = 0;
  int group_size = 0;
};

struct Linear {
  Tensor weight{};  // [out, in] (affine: the packed codes)
  Tensor bias{};    // [out], or empty
  WeightScheme scheme = WeightScheme::kDense;
  const void* adapter = nullptr;  // a low-rank adapter bound to it; none yet
  AffineScales affine{};          // the affine scheme's scales and biases

  bool empty() const { return weight.empty(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const {
    return scheme == WeightScheme::kAffine ? weight.dim(1) * 32 / affine.bits : weight.dim(1);
  }
  // Rows [begin, begin + count) of the output features, as a view (codes, scales and
  // biases alike).
  Linear rows(int64_t begin, int64_t count) const;
  // Bytes of the weight as stored: codes, scales and biases for an affine weight.
  size_t weight_bytes() const;
};

std::string scheme_name(const Linear& linear);  // "bf16", "affine 4-bit, groups of 64"

// One output of a projection: out (row stride ldo) = x · linearᵀ (+ bias).
struct Projection {
  const Linear* linear;
  float* out;
  int64_t ldo;
};

}  // namespace kettle
