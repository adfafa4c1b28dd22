// Linear: a projection's weights as the backend reads them — the matrix, the
// scheme it is stored in, an optional bias, and the slot an adapter (LoRA)
// will attach to. Schemes: dense f32/f16/bf16, MLX's affine quantization
// (packed codes with a scale and a bias per group: tensor/affine_quant.h), and
// FP8 e4m3 codes with an f32 scale per block of rows × columns. A
// backend refuses a scheme or an adapter it cannot run, by name, rather than
// reading it as something else (Backend::runs says which it runs).
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace kettle {

enum class WeightScheme { kDense, kAffine, kFp8 };

// The affine scheme's parts: weight is then the packed codes (U32, [out, in · bits / 32]).
struct AffineScales {
  Tensor scales;  // [out, in / group_size]
  Tensor biases;  // [out, in / group_size]
  int bits = 0;
  int group_size = 0;
};

// The FP8 scheme's scales: weight is then the e4m3 codes (F8E4M3, [out, in]), and element
// (r, c) stands for code · scales[r / block_rows, c / block_cols]. A scale per output row is
// a block of 1 × in, one for the whole tensor a block of out × in.
struct Fp8Scales {
  Tensor scales;  // f32 [ceil(out / block_rows), ceil(in / block_cols)]
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

struct Linear {
  Tensor weight{};  // [out, in] (affine: the packed codes)
  Tensor bias{};    // [out], or empty
  WeightScheme scheme = WeightScheme::kDense;
  const void* adapter = nullptr;  // a low-rank adapter bound to it; none yet
  AffineScales affine{};          // the affine scheme's scales and biases
  Fp8Scales fp8{};                // the FP8 scheme's scales

  bool empty() const { return weight.empty(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const {
    return scheme == WeightScheme::kAffine ? weight.dim(1) * 32 / affine.bits : weight.dim(1);
  }
  // Rows [begin, begin + count) of the output features, as a view (codes, scales and
  // biases alike); an FP8 view starts on a block of its scales (views_rows_at).
  Linear rows(int64_t begin, int64_t count) const;
  // Whether a row view may start at `row` (FP8: only where a block of scales starts).
  bool views_rows_at(int64_t row) const;
  // Bytes of the weight as stored: codes, scales and biases for an affine weight.
  size_t weight_bytes() const;
};

std::string scheme_name(const Linear& linear);  // "bf16", "affine 4-bit, groups of 64", "fp8 e4m3, blocks of 128×128"

// Row r of a quantized (affine or FP8) weight as the f32 values it stands for.
void dequantize_row(const Linear& linear, int64_t r, float* out);

// One output of a projection: out (row stride ldo) = x · linearᵀ (+ bias).
struct Projection {
  const Linear* linear;
  float* out;
  int64_t ldo;
};

}  // namespace kettle
