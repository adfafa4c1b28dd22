// Affine quantization as MLX stores it (config "quantization", "mode": "affine"; what
// mlx-community publishes and `kettle convert -q` writes).
//
// A weight [out, in] is cut along `in` into groups of group_size elements; group g of a
// row has a scale s and a bias b, and element j a code q in [0, 2^bits) with
// w = s · q + b. A row's codes are one little-endian bit stream — element j at bits
// [j·bits, (j+1)·bits) — stored as uint32 words, in · bits / 32 of them per row (for 3,
// 5 and 6 bits, MLX's packs of 8 or 4 codes in 3 or 5 bytes are this same stream).
// Scales and biases are [out, in / group_size] in the model's float type. 32 codes
// fill exactly `bits` words, so every group starts on a word.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace kettle {

bool affine_bits_supported(int bits);         // 2, 3, 4, 5, 6, 8
bool affine_group_size_supported(int group);  // 32, 64, 128

// One row of an affine-quantized weight.
struct AffineRow {
  const uint32_t* codes = nullptr;  // in · bits / 32 words
  const void* scales = nullptr;     // in / group_size, of `dtype`
  const void* biases = nullptr;
  DType dtype = DType::kBF16;
};

// Row r of a weight whose packed codes, scales and biases are these tensors.
AffineRow affine_row(const Tensor& codes, const Tensor& scales, const Tensor& biases, int64_t r);

// Elements [begin, begin + count) of a row, as f32 (s · q + b, exact in f32 for the
// product). begin and count are multiples of 32.
void affine_dequantize(const AffineRow& row, int bits, int group_size, int64_t begin, int64_t count, float* out);

// The code of element j of a row's bit stream.
uint32_t affine_code(const uint32_t* codes, int bits, int64_t j);

// How a group's scale and bias are chosen.
enum class AffineFit {
  // MLX's quantize, exactly: the scale spans [min, max] in 2^bits − 1 steps, its sign and
  // the edge (the end of larger magnitude) chosen so that edge is exactly a code, the bias
  // that edge (0 when it rounds to code 0); codes are round-to-nearest-even of
  // (w − b) / s, clamped. The codes are made with the unrounded scale and bias.
  kMlx,
  // Least squares: from MLX's choice and from plain [min, max], a few rounds of refitting
  // s and b to the codes (the linear regression of w on q) and re-rounding, with s and b
  // rounded to the type they are stored in; the lowest squared error wins. Same format,
  // typically a fifth less error at 4 bits.
  kLeastSquares,
};

// One row of `in` floats quantized. Scales and biases come back in f32; the checkpoint
// stores them in `stored` (bf16, f16 or f32: kLeastSquares fits them already rounded).
// `codes` receives in · bits / 32 words.
void affine_quantize_row(const float* w, int64_t in, int bits, int group_size, uint32_t* codes, float* scales,
                         float* biases, AffineFit fit = AffineFit::kMlx, DType stored = DType::kF32);

}  // namespace kettle
