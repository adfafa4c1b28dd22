// Greedy sampling on the device: the id of each row's largest logit (ties to
// the lower id, as the host argmax), so only the id crosses to the host.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                int32_t* out) {
  grid_wait();
  __shared__ float best_v[kArgmaxThreads / kWarp];
  __shared__ int best_i[kArgmaxThreads / kWarp];
  const float* row = logits + blockIdx.x * vocab;
  float best = -INFINITY;
  int index = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] > best) {
      best = row[i];
      index = static_cast<int>(i);
    }
  const auto reduce = [&] {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, index, o);
      if (ov > best || (ov == best && oi < index)) {
        best = ov;
        index = oi;
      }
    }
  };
  reduce();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    best_v[warp] = best;
    best_i[warp] = index;
  }
  __syncthreads();
  if (warp != 0) return;
  const int warps = blockDim.x / kWarp;
  best = lane < warps ? best_v[lane] : -INFINITY;
  index = lane < warps ? best_i[lane] : 0x7fffffff;
  reduce();
  if (lane == 0) out[blockIdx.x] = index;
}

}  // namespace

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, cudaStream_t stream) {
  launch(argmax_kernel, static_cast<unsigned>(rows), kArgmaxThreads, 0, stream, logits, vocab, out);
}

}  // namespace kettle::cuda
