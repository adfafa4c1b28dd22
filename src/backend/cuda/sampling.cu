// Greedy sampling on the device: the id of each row's largest logit (ties to
// the lower id, as the host argmax), so only the id crosses to the host.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxBlocks = 128;  // per row: enough blocks to stream the logits at bandwidth

struct Best {
  float value;
  int index;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.index, o)};
    b = better(b, other);
  }
  return b;
}

__device__ Best block_best(Best b) {
  __shared__ Best warps[kArgmaxThreads / kWarp];
  b = warp_best(b);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();
  if (lane == 0) warps[warp] = b;
  __syncthreads();
  b = lane < kArgmaxThreads / kWarp ? warps[lane] : Best{-INFINITY, 0x7fffffff};
  return warp_best(b);
}

// grid (kArgmaxBlocks, rows): each block reduces a slice; the last block of a row to
// finish (arrival counter, left at zero) reduces the blocks' results.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int64_t vocab, Best* partial, unsigned* arrivals, int32_t* out) {
  grid_wait();
  const int64_t row = blockIdx.y;
  const float* x = logits + row * vocab;
  Best b{-INFINITY, 0x7fffffff};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vocab;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    b = better(b, Best{x[i], static_cast<int>(i)});
  b = block_best(b);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partial[row * gridDim.x + blockIdx.x] = b;
    __threadfence();
    last = atomicAdd(arrivals + row, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Best r{-INFINITY, 0x7fffffff};
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    const volatile Best* p = partial + row * gridDim.x + i;
    r = better(r, Best{p->value, p->index});
  }
  r = block_best(r);
  if (threadIdx.x == 0) {
    out[row] = r.index;
    arrivals[row] = 0;
  }
}

}  // namespace

int64_t argmax_workspace_bytes(int64_t rows) {
  return rows * (kArgmaxBlocks * static_cast<int64_t>(sizeof(Best)) + static_cast<int64_t>(sizeof(unsigned)));
}

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, void* workspace,
                 cudaStream_t stream) {
  // workspace: [rows] arrival counters (zero) | [rows, blocks] partial results
  auto* arrivals = static_cast<unsigned*>(workspace);
  auto* partial = reinterpret_cast<Best*>(static_cast<char*>(workspace) + ((rows * sizeof(unsigned) + 15) / 16 * 16));
  launch(argmax_kernel, dim3(kArgmaxBlocks, static_cast<unsigned>(rows)), kArgmaxThreads, 0, stream, logits, vocab,
         partial, arrivals, out);
}

}  // namespace kettle::cuda
