// Internal: the per-ISA matmul and conversion kernels behind cpu_matmul and
// convert_to_f32. Each is compiled in its own file with its own -m flags and
// must only be called when cpu_features() says the CPU has that ISA.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/linear.h"
#include "tensor/affine_quant.h"
#include "tensor/dtype.h"

namespace kettle {

// x's rows as the AVX-512 BF16 kernel for 4-bit affine weights reads them (made once per
// matmul by split_x_bf16): bf16 parts hi = bf16(x) and lo = bf16(x − hi), and Σ (hi + lo)
// per 32 elements. The parts are in the kernel's order: per block of 64 elements (or a
// last one of 32), its even elements, then its odd ones.
struct Bf16SplitX {
  std::vector<uint16_t> hi, lo;  // [n, k], blocks reordered
  std::vector<float> sums;       // [n, k / 32]
  int64_t k = 0;
  // Σ (hi + lo) over elements [begin, begin + count) of token row c (multiples of 32), in order.
  float group_sum(int64_t c, int64_t begin, int64_t count) const {
    float s = 0.0f;
    for (int64_t j = begin; j < begin + count; j += 32) s += sums[static_cast<size_t>(c * (k / 32) + j / 32)];
    return s;
  }
};
void split_x_bf16(const float* x, int64_t n, int64_t ldx, int64_t k, Bf16SplitX& out);
// Whether a weight takes the BF16 kernel (4-bit affine; k a multiple of 32 always is).
inline bool affine_bf16_kernel_applies(const AffineScales* affine) {
  return affine != nullptr && affine->bits == 4;
}

// A whole matmul out[n, m] = x[n, k] · wᵀ + bias; a thread computes a range of
// output features (rows of w) so each thread streams distinct weight bytes.
struct MatmulTask {
  const float* x = nullptr;  // [n, k], row stride ldx
  int64_t n = 0;
  int64_t ldx = 0;
  const void* w = nullptr;  // [m, k] row-major, dtype
  DType dtype = DType::kF32;
  int64_t k = 0;
  const float* bias = nullptr;  // [m] f32, or nullptr
  float* out = nullptr;         // [n, m], row stride ldo
  int64_t ldo = 0;
  // With affine parts, w holds packed codes (dtype kU32) of rows of k elements: the
  // kernels widen each 8 or 16 of them to s · q + b as they load them, so the sums are
  // those of a dense f32 weight of the dequantized values (k is a multiple of 32).
  const AffineScales* affine = nullptr;
  // x split for the AVX-512 BF16 kernel, when the path is kAvx512Bf16 and the weight 4-bit.
  const Bf16SplitX* split_x = nullptr;
};

// One row of an affine task as the kernels' loaders read it.
struct AffineRowView {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* biases = nullptr;
  DType dtype = DType::kBF16;
  int group_size = 0;
  int bits = 0;

  // The group's scale and bias, widened once per group as a tile walks along k.
  void group(int64_t g, float& s, float& b) {
    if (g != cached_group) {
      cached_group = g;
      cached_scale = dtype_value(scales, dtype, g);
      cached_bias = dtype_value(biases, dtype, g);
    }
    s = cached_scale;
    b = cached_bias;
  }
  int64_t cached_group = -1;
  float cached_scale = 0, cached_bias = 0;
};

inline AffineRowView affine_row_view(const MatmulTask& t, int64_t row) {
  const AffineScales& a = *t.affine;
  const size_t sb_row = static_cast<size_t>(a.scales.dim(1)) * dtype_size(a.scales.dtype);
  return {static_cast<const uint8_t*>(t.w) + static_cast<size_t>(row * t.k * a.bits / 8),
          static_cast<const uint8_t*>(a.scales.data) + static_cast<size_t>(row) * sb_row,
          static_cast<const uint8_t*>(a.biases.data) + static_cast<size_t>(row) * sb_row,
          a.scales.dtype,
          a.group_size,
          a.bits};
}

// Computes out[:, row_begin:row_end]. Every output is summed in an order that
// depends only on k (not on the row range), so any split gives the same bits.
void matmul_rows_generic(const MatmulTask& task, int64_t row_begin, int64_t row_end);
void matmul_rows_avx2(const MatmulTask& task, int64_t row_begin, int64_t row_end);
void matmul_rows_avx512(const MatmulTask& task, int64_t row_begin, int64_t row_end);
// 4-bit affine tasks with a split x through vdpbf16ps; any other task as matmul_rows_avx512.
void matmul_rows_avx512_bf16(const MatmulTask& task, int64_t row_begin, int64_t row_end);

void convert_to_f32_generic(const void* src, DType dtype, float* dst, int64_t n);
void convert_to_f32_avx2(const void* src, DType dtype, float* dst, int64_t n);
void convert_to_f32_avx512(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace kettle
