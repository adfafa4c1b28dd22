// Internal: the per-ISA matmul and conversion kernels behind cpu_matmul and
// convert_to_f32. Each is compiled in its own file with its own -m flags and
// must only be called when cpu_features() says the CPU has that ISA.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kettle {

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
};

// Computes out[:, row_begin:row_end]. Every output is summed in an order that
// depends only on k (not on the row range), so any split gives the same bits.
void matmul_rows_generic(const MatmulTask& task, int64_t row_begin, int64_t row_end);
void matmul_rows_avx2(const MatmulTask& task, int64_t row_begin, int64_t row_end);
void matmul_rows_avx512(const MatmulTask& task, int64_t row_begin, int64_t row_end);

void convert_to_f32_generic(const void* src, DType dtype, float* dst, int64_t n);
void convert_to_f32_avx2(const void* src, DType dtype, float* dst, int64_t n);
void convert_to_f32_avx512(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace kettle
