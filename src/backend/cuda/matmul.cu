// Decode matmuls (one token): GEMV over bf16 weights, memory-bound, so each
// warp streams one output row with 16-byte loads, eight in flight per lane,
// and several weights (q/k/v; gate/up) share one launch so the grid is large
// enough to keep HBM busy. Prefill goes to cuBLAS (cuda_backend.cpp); the
// small conversion and bias kernels it needs live here too.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kGemvWarps = 4;  // warps per block, one output row each

struct GemvBatch {
  GemvTarget target[kMaxGemvTargets];
  int begin[kMaxGemvTargets + 1];  // first global row of each target; begin[count] = total
  int count;
  RowNormArgs norm;
  int accumulate;
};

__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_kernel(GemvBatch batch, const float* __restrict__ x, int k) {
  const int global_row = blockIdx.x * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (global_row >= batch.begin[batch.count]) {
    grid_wait();
    return;
  }
  int t = 0;
  while (t + 1 < batch.count && global_row >= batch.begin[t + 1]) ++t;
  const GemvTarget& target = batch.target[t];
  const int row = global_row - batch.begin[t];
  const Bf16Bits* rows[1] = {target.w + static_cast<size_t>(row) * k};
  float sums[1];
  rows_dot<1>(rows, x, k, lane, sums, batch.norm);
  if (lane == 0) {
    const float v = sums[0] + (target.bias != nullptr ? target.bias[row] : 0.0f);
    target.out[row] = batch.accumulate ? target.out[row] + v : v;
  }
}

__global__ void __launch_bounds__(kGemvWarps * kWarp)
    gemv_gated_kernel(GemvTarget gate, GemvTarget up, Activation act, const float* __restrict__ x, int k,
                      RowNormArgs norm, float* out) {
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= gate.rows) {
    grid_wait();
    return;
  }
  const Bf16Bits* rows[2] = {gate.w + static_cast<size_t>(row) * k, up.w + static_cast<size_t>(row) * k};
  float sums[2];
  rows_dot<2>(rows, x, k, lane, sums, norm);
  float g = sums[0], u = sums[1];
  if (lane == 0) {
    if (gate.bias != nullptr) g += gate.bias[row];
    if (up.bias != nullptr) u += up.bias[row];
    out[row] = activate(act, g) * u;
  }
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, int64_t k, int64_t ldx, __nv_bfloat16* out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * k) return;
  const int64_t t = i / k, c = i % k;
  out[i] = __float2bfloat16_rn(x[t * ldx + c]);
}

__global__ void to_bf16_split_kernel(const float* __restrict__ x, int64_t n, int64_t k, int64_t ldx,
                                     __nv_bfloat16* out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * k) return;
  const int64_t t = i / k, c = i % k;
  const float v = x[t * ldx + c];
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  out[i] = hi;
  out[n * k + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
}

__global__ void sum_halves_kernel(const float* __restrict__ wide, int64_t n, int64_t m, const float* __restrict__ bias,
                                  float* out, int64_t ldo, bool accumulate) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * m) return;
  const int64_t t = i / m, c = i % m;
  const float v = wide[i] + wide[n * m + i] + (bias != nullptr ? bias[c] : 0.0f);
  out[t * ldo + c] = accumulate ? out[t * ldo + c] + v : v;
}

__global__ void add_bias_kernel(float* out, int64_t n, int64_t m, int64_t ldo, const float* __restrict__ bias) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * m) return;
  const int64_t t = i / m, c = i % m;
  out[t * ldo + c] += bias[c];
}

}  // namespace

bool gemv_supported(int64_t k) { return k % 8 == 0 && k <= (int64_t{1} << 30); }

static RowNormArgs row_norm(const GemvNorm& norm) { return {norm.weight, norm.eps, norm.add_one ? 1 : 0}; }

void gemv(const GemvTarget* targets, int count, const float* x, int k, const GemvNorm& norm, bool accumulate,
          cudaStream_t stream) {
  GemvBatch batch{};
  batch.norm = row_norm(norm);
  batch.accumulate = accumulate ? 1 : 0;
  batch.count = count;
  batch.begin[0] = 0;
  for (int i = 0; i < count; ++i) {
    batch.target[i] = targets[i];
    batch.begin[i + 1] = batch.begin[i] + targets[i].rows;
  }
  launch(gemv_kernel, blocks_for(batch.begin[count], kGemvWarps), kGemvWarps * kWarp, 0, stream, batch, x, k);
}

void gemv_gated(const GemvTarget& gate, const GemvTarget& up, Activation act, const float* x, int k,
                const GemvNorm& norm, float* out, cudaStream_t stream) {
  launch(gemv_gated_kernel, blocks_for(gate.rows, kGemvWarps), kGemvWarps * kWarp, 0, stream, gate, up, act, x, k,
         row_norm(norm), out);
}

void to_bf16(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx, reinterpret_cast<__nv_bfloat16*>(out));
}

void to_bf16_split(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_split_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx, reinterpret_cast<__nv_bfloat16*>(out));
}

void sum_halves(const float* wide, int64_t n, int64_t m, const float* bias, float* out, int64_t ldo, bool accumulate,
                cudaStream_t stream) {
  launch(sum_halves_kernel, blocks_for(n * m, 256), 256, 0, stream, wide, n, m, bias, out, ldo, accumulate);
}

void add_bias(float* out, int64_t n, int64_t m, int64_t ldo, const float* bias, cudaStream_t stream) {
  launch(add_bias_kernel, blocks_for(n * m, 256), 256, 0, stream, out, n, m, ldo, bias);
}

}  // namespace kettle::cuda
