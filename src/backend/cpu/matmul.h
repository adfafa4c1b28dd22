// cpu_matmul: out = x · wᵀ (+ bias) for the CPU backend, split over a thread
// pool by output feature and run by the best kernel for the CPU and shape.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/linear.h"
#include "tensor/tensor.h"
#include "util/thread_pool.h"

namespace kettle {

// One weight of a grouped matmul: out (row stride ldo) = x · wᵀ (+ bias). With `affine`,
// w holds packed codes (tensor/affine_quant.h), dequantized a panel of rows at a time
// into f32 that the kernels then read: the sums are the same as for a dense f32 weight
// holding the dequantized values.
struct MatmulTarget {
  const Tensor* w;
  const Tensor* bias;  // or nullptr
  float* out;
  int64_t ldo;
  const AffineScales* affine = nullptr;
};

// out (row stride ldo) = x · lᵀ (+ its bias) for a dense or affine Linear.
inline MatmulTarget matmul_target(const Linear& l, float* out, int64_t ldo) {
  return {&l.weight, l.bias.empty() ? nullptr : &l.bias, out, ldo,
          l.scheme == WeightScheme::kAffine ? &l.affine : nullptr};
}

// Who computes a matmul: one of the register-tiled kernels, or OpenBLAS sgemm
// on weight panels widened to f32. kAvx512Bf16: 4-bit affine weights through
// BF16 dot products (x as bf16 hi + lo: sums within the last bits of the dense
// f32 matmul, not bit for bit), anything else as kAvx512.
enum class MatmulPath { kGeneric, kAvx2, kAvx512, kBlas, kAvx512Bf16 };

const char* matmul_path_name(MatmulPath path);

// Whether this CPU can run the path (the ISA cap is not consulted).
bool matmul_path_available(MatmulPath path);

// The path cpu_matmul takes for n token rows of weights in dtype, under the ISA
// cap of set_cpu_isa_cap.
MatmulPath choose_matmul_path(int64_t n, DType dtype);

// out[n, m] (row stride ldo) = x[n, k] (row stride ldx) · wᵀ (+ bias[m]).
// w: [m, k] row-major bf16/f16/f32; bias: [m] bf16/f16/f32 or nullptr.
// All arithmetic is f32; bf16/f16 weights are widened exactly. out must not
// overlap x. Throws kettle::Error (kInternal) on inconsistent shapes.
void cpu_matmul(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias,
                float* out, int64_t ldo);

// cpu_matmul on a given path (tests and benchmarks force each one). The path
// must be available.
void cpu_matmul_on(MatmulPath path, ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const Tensor& w,
                   const Tensor* bias, float* out, int64_t ldo);

// Several weights applied to the same x in one pass over the pool (q/k/v, gate/up): the
// rows of all of them are split over the threads together, so small weights cost no
// extra hand-off. Same numerics as one cpu_matmul per target.
void cpu_matmul_many(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const MatmulTarget* targets,
                     int count);
void cpu_matmul_many_on(MatmulPath path, ThreadPool& pool, const float* x, int64_t n, int64_t ldx,
                        const MatmulTarget* targets, int count);

}  // namespace kettle
