// Decode matmuls of one token, the default (fastest) path: GEMV over bf16
// weights, memory-bound, so each output row is streamed with 16-byte loads by
// one warp or a group of warps splitting k, and several weights (q/k/v;
// gate/up) share one launch so the grid is large enough to keep HBM busy. x is
// either rounded to bf16 as it is read (the rounding the GEMMs take) or used
// exact, as the backend's activation rule says. Its sums run in another order
// than a batch's GEMM, so a decode alone and batched may differ in the last
// bits; --batch-invariant decodes through a fixed cuBLASLt plan instead
// (fixed_gemm.h). The GEMMs' small conversion and bias kernels live here.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kGemvWarps = 8;      // warps per block
constexpr int kGemvMinBlocks = 4;  // blocks per SM the register budget must allow (64 registers)
// Output rows per warp group of the plain GEMV. Two, as the gated GEMV has (gate and up):
// twice the weight bytes in flight per warp (H200, 2026-12-02, tg128: 8b 217.7 → 236.1,
// 1b 1,023 → 1,082, qwen3-0.6b 1,079 → 1,076 tok/s; four rows: 235.1, 930, 1,014).
constexpr int kGemvRows = 2;

struct GemvBatch {
  GemvTarget target[kMaxGemvTargets];
  int begin[kMaxGemvTargets + 1];  // first global row of each target; begin[count] = total
  int count;
  int accumulate;
};

// The block's warps form kGemvWarps / S groups of S warps, one output row (R weight rows)
// per group; the S warps of a group split the row's k, so narrow matrices with few rows
// still occupy every warp slot. Sums come back on the group's first lane (returns true
// there); the split's partials are added in a fixed order, so results are deterministic.
template <int R, int S, bool RoundX>
__device__ __forceinline__ bool group_rows_dot(const Bf16Bits* const (&rows)[R], bool valid, const float* x, int k,
                                               float (&sums)[R]) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, slice = warp % S;
  if (valid) {
    rows_dot_part<R, kRowLoads / R, RoundX>(rows, x, k, slice * kWarp + lane, S * kWarp, sums);
  } else {
    grid_wait();
#pragma unroll
    for (int r = 0; r < R; ++r) sums[r] = 0.0f;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) sums[r] = warp_sum(sums[r]);
  if constexpr (S == 1) {
    return valid && lane == 0;
  } else {
    __shared__ float partial[R][kGemvWarps];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) partial[r][warp] = sums[r];
    __syncthreads();
    if (!valid || slice != 0 || lane != 0) return false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float total = 0.0f;
      for (int j = 0; j < S; ++j) total += partial[r][warp + j];
      sums[r] = total;
    }
    return true;
  }
}

// A group of S warps computes R consecutive output rows of the batch (targets packed
// back to back; a row past the end recomputes the last row and is not written).
template <int S, int R, bool RoundX>
__global__ void __launch_bounds__(kGemvWarps* kWarp, kGemvMinBlocks)
    gemv_kernel(GemvBatch batch, const float* __restrict__ x, int k) {
  const int first = (blockIdx.x * (kGemvWarps / S) + threadIdx.x / kWarp / S) * R;
  const int total = batch.begin[batch.count];
  const bool valid = first < total;
  int target[R], row[R];
  const Bf16Bits* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int global_row = min(first + r, total - 1);
    int t = 0;
    while (t + 1 < batch.count && global_row >= batch.begin[t + 1]) ++t;
    target[r] = t;
    row[r] = global_row - batch.begin[t];
    rows[r] = valid ? batch.target[t].w + static_cast<size_t>(row[r]) * k : nullptr;
  }
  float sums[R];
  if (!group_rows_dot<R, S, RoundX>(rows, valid, x, k, sums)) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (first + r >= total) break;
    const GemvTarget& t = batch.target[target[r]];
    const float v = sums[r] + (t.bias != nullptr ? t.bias[row[r]] : 0.0f);
    t.out[row[r]] = batch.accumulate ? t.out[row[r]] + v : v;
  }
}

template <int S, bool RoundX>
__global__ void __launch_bounds__(kGemvWarps* kWarp, kGemvMinBlocks)
    gemv_gated_kernel(GemvTarget gate, GemvTarget up, Activation act, const float* __restrict__ x, int k, float* out) {
  const int row = blockIdx.x * (kGemvWarps / S) + threadIdx.x / kWarp / S;
  const bool valid = row < gate.rows;
  const Bf16Bits* rows[2] = {valid ? gate.w + static_cast<size_t>(row) * k : nullptr,
                             valid ? up.w + static_cast<size_t>(row) * k : nullptr};
  float sums[2];
  if (group_rows_dot<2, S, RoundX>(rows, valid, x, k, sums)) {
    const float g = sums[0] + (gate.bias != nullptr ? gate.bias[row] : 0.0f);
    const float u = sums[1] + (up.bias != nullptr ? up.bias[row] : 0.0f);
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

bool gemv_supported(int64_t k) {
  return k % 8 == 0 && k <= (int64_t{1} << 30);
}

// Warps of the GEMV kernels resident on the whole GPU at once: the launch bounds make the
// registers allow kGemvMinBlocks blocks per SM (shared memory is a few bytes).
static int64_t resident_warps() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return int64_t{sms} * kGemvMinBlocks * kGemvWarps;
}

// Warps per warp group (H200, 2026-12-02), for `rows` groups of k weights each (output
// rows; pairs of them for the plain GEMV, since two rows per group were measured).
// Deep matrices (k and groups both ≥ 4096: the 8b MLP's gate/up) split 4 ways: more,
// shorter warps keep more loads in flight (8b decode 215.5 against 210.5 tok/s unsplit,
// measured with one row per group). Otherwise k is split only while groups × split warps
// still fit in one wave, so a matrix with fewer groups than warp slots fills the GPU
// without adding a wave; splitting k = 2048 rows 4 ways leaves two loads per lane (1b
// decode 934 against 1029 tok/s).
static int gemv_split(int64_t rows, int64_t k) {
  if (rows >= 4096 && k >= 4096) return 4;
  static const int64_t resident = resident_warps();
  int split = 1;
  while (split < 4 && rows * split * 2 <= resident) split *= 2;
  return split;
}

template <int S>
static void launch_gemv(const GemvBatch& batch, const float* x, int k, bool round_x, cudaStream_t stream) {
  const unsigned blocks = blocks_for(batch.begin[batch.count], kGemvWarps / S * kGemvRows);
  if (round_x)
    launch(gemv_kernel<S, kGemvRows, true>, blocks, kGemvWarps * kWarp, 0, stream, batch, x, k);
  else
    launch(gemv_kernel<S, kGemvRows, false>, blocks, kGemvWarps * kWarp, 0, stream, batch, x, k);
}

template <int S>
static void launch_gemv_gated(const GemvTarget& gate, const GemvTarget& up, Activation act, const float* x, int k,
                              bool round_x, float* out, cudaStream_t stream) {
  const unsigned blocks = blocks_for(gate.rows, kGemvWarps / S);
  if (round_x)
    launch(gemv_gated_kernel<S, true>, blocks, kGemvWarps * kWarp, 0, stream, gate, up, act, x, k, out);
  else
    launch(gemv_gated_kernel<S, false>, blocks, kGemvWarps * kWarp, 0, stream, gate, up, act, x, k, out);
}

void gemv(const GemvTarget* targets, int count, const float* x, int k, bool accumulate, bool round_x,
          cudaStream_t stream) {
  GemvBatch batch{};
  batch.accumulate = accumulate ? 1 : 0;
  batch.count = count;
  batch.begin[0] = 0;
  for (int i = 0; i < count; ++i) {
    batch.target[i] = targets[i];
    batch.begin[i + 1] = batch.begin[i] + targets[i].rows;
  }
  switch (gemv_split(batch.begin[count] / kGemvRows, k)) {
    case 1:
      return launch_gemv<1>(batch, x, k, round_x, stream);
    case 2:
      return launch_gemv<2>(batch, x, k, round_x, stream);
    default:
      return launch_gemv<4>(batch, x, k, round_x, stream);
  }
}

void gemv_gated(const GemvTarget& gate, const GemvTarget& up, Activation act, const float* x, int k, bool round_x,
                float* out, cudaStream_t stream) {
  switch (gemv_split(gate.rows, k)) {
    case 1:
      return launch_gemv_gated<1>(gate, up, act, x, k, round_x, out, stream);
    case 2:
      return launch_gemv_gated<2>(gate, up, act, x, k, round_x, out, stream);
    default:
      return launch_gemv_gated<4>(gate, up, act, x, k, round_x, out, stream);
  }
}

void to_bf16(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx, reinterpret_cast<__nv_bfloat16*>(out));
}

void to_bf16_split(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_split_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx,
         reinterpret_cast<__nv_bfloat16*>(out));
}

void sum_halves(const float* wide, int64_t n, int64_t m, const float* bias, float* out, int64_t ldo, bool accumulate,
                cudaStream_t stream) {
  launch(sum_halves_kernel, blocks_for(n * m, 256), 256, 0, stream, wide, n, m, bias, out, ldo, accumulate);
}

void add_bias(float* out, int64_t n, int64_t m, int64_t ldo, const float* bias, cudaStream_t stream) {
  launch(add_bias_kernel, blocks_for(n * m, 256), 256, 0, stream, out, n, m, ldo, bias);
}

}  // namespace kettle::cuda
