// Routed mixture of experts with no host round trip: routing (softmax, top-k
// with ties to the lower index, renormalisation) runs on the device, and the
// expert GEMVs read the chosen expert's weights through a device table of
// pointers, so a recorded decode step stays valid whatever the router picks.
// Per (token, slot) GEMVs re-read an expert's weights for every token that
// chose it: right for decode, slow for long MoE prefills (a grouped GEMM is
// the next step there).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kMaxTopK = 16;
constexpr int kMoeWarps = 4;

// grid (experts / warps, n): one warp per router logit, x exact (MoE models keep exact
// activations: a near tie between experts picks as the reference does) and the same
// arithmetic for any token count, so a token routes alike alone or batched (the matmul
// path would switch between the GEMV and hi + lo GEMMs with the row count).
__global__ void __launch_bounds__(kMoeWarps* kWarp)
    router_logits_kernel(const float* __restrict__ x, int64_t hidden, const Bf16Bits* __restrict__ router,
                         int n_experts, float* logits) {
  const int64_t e = blockIdx.x * kMoeWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (e >= n_experts) {
    grid_wait();
    return;
  }
  const int64_t t = blockIdx.y;
  const float y = row_dot(router + e * hidden, x + t * hidden, static_cast<int>(hidden), lane);
  if (lane == 0) logits[t * n_experts + e] = y;
}

// One warp per token.
__global__ void route_top_k_kernel(const float* __restrict__ logits, int n_experts, int top_k, bool renormalize,
                                   int32_t* ids, float* weights) {
  grid_wait();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* l = logits + t * n_experts;
  float big = -INFINITY;
  for (int e = lane; e < n_experts; e += kWarp) big = fmaxf(big, l[e]);
  big = warp_max(big);
  float sum = 0.0f;
  for (int e = lane; e < n_experts; e += kWarp) sum += expf(l[e] - big);
  sum = warp_sum(sum);
  int chosen[kMaxTopK];
  float prob[kMaxTopK];
  float top_sum = 0.0f;
  for (int s = 0; s < top_k; ++s) {
    // Best not yet chosen: larger probability first, lower index on ties.
    float best = -INFINITY;
    int best_e = n_experts;
    for (int e = lane; e < n_experts; e += kWarp) {
      bool taken = false;
      for (int c = 0; c < s; ++c) taken |= chosen[c] == e;
      const float v = l[e];
      if (!taken && (v > best || (v == best && e < best_e))) {
        best = v;
        best_e = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ov > best || (ov == best && oe < best_e)) {
        best = ov;
        best_e = oe;
      }
    }
    chosen[s] = best_e;
    prob[s] = expf(best - big) / sum;
    top_sum += prob[s];
  }
  if (lane != 0) return;
  // Expert order, as transformers' index_add_ sums them.
  for (int i = 1; i < top_k; ++i)
    for (int j = i; j > 0 && chosen[j - 1] > chosen[j]; --j) {
      const int e = chosen[j];
      chosen[j] = chosen[j - 1];
      chosen[j - 1] = e;
      const float pr = prob[j];
      prob[j] = prob[j - 1];
      prob[j - 1] = pr;
    }
  for (int s = 0; s < top_k; ++s) {
    ids[t * top_k + s] = chosen[s];
    weights[t * top_k + s] = renormalize ? prob[s] / top_sum : prob[s];
  }
}

// grid (inter / warps, n * top_k): one warp per output row of one (token, slot).
__global__ void __launch_bounds__(kMoeWarps* kWarp)
    moe_gate_up_kernel(const float* __restrict__ x, int64_t hidden, const int32_t* __restrict__ ids, int top_k,
                       const Bf16Bits* const* gate, const Bf16Bits* const* up, int64_t inter, Activation act,
                       float* h) {
  const int64_t row = blockIdx.x * kMoeWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  grid_wait();  // the expert ids come from the routing kernel
  if (row >= inter) return;
  const int64_t pair = blockIdx.y;  // t * top_k + slot
  const int64_t t = pair / top_k;
  const int e = ids[pair];
  const Bf16Bits* rows[2] = {gate[e] + row * hidden, up[e] + row * hidden};
  float sums[2];
  rows_dot<2>(rows, x + t * hidden, static_cast<int>(hidden), lane, sums);
  if (lane == 0) h[pair * inter + row] = activate(act, sums[0]) * sums[1];
}

// grid (hidden / warps, n): one warp per output element, the slots summed in expert order.
__global__ void __launch_bounds__(kMoeWarps* kWarp)
    moe_down_kernel(const float* __restrict__ h, int64_t inter, const int32_t* __restrict__ ids,
                    const float* __restrict__ weights, int top_k, const Bf16Bits* const* down, int64_t hidden,
                    float* out) {
  const int64_t row = blockIdx.x * kMoeWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  grid_wait();
  if (row >= hidden) return;
  const int64_t t = blockIdx.y;
  float sum = 0.0f;
  for (int s = 0; s < top_k; ++s) {
    const int64_t pair = t * top_k + s;
    const float y = row_dot(down[ids[pair]] + row * inter, h + pair * inter, static_cast<int>(inter), lane);
    sum += y * weights[pair];
  }
  if (lane == 0) out[t * hidden + row] = sum;
}

}  // namespace

void router_logits(const float* x, int64_t n, int64_t hidden, const Bf16* router, int n_experts, float* logits,
                   cudaStream_t stream) {
  const dim3 grid(blocks_for(n_experts, kMoeWarps), static_cast<unsigned>(n));
  launch(router_logits_kernel, grid, kMoeWarps * kWarp, 0, stream, x, hidden, router, n_experts, logits);
}

void route_top_k(const float* logits, int64_t n, int n_experts, int top_k, bool renormalize, int32_t* ids,
                 float* weights, cudaStream_t stream) {
  launch(route_top_k_kernel, static_cast<unsigned>(n), kWarp, 0, stream, logits, n_experts, top_k, renormalize, ids,
         weights);
}

void moe_gate_up(const float* x, int64_t n, int64_t hidden, const int32_t* ids, int top_k, const Bf16* const* gate,
                 const Bf16* const* up, int64_t inter, Activation act, float* h, cudaStream_t stream) {
  const dim3 grid(blocks_for(inter, kMoeWarps), static_cast<unsigned>(n * top_k));
  launch(moe_gate_up_kernel, grid, kMoeWarps * kWarp, 0, stream, x, hidden, ids, top_k, gate, up, inter, act, h);
}

void moe_down(const float* h, int64_t n, int64_t inter, const int32_t* ids, const float* weights, int top_k,
              const Bf16* const* down, int64_t hidden, float* out, cudaStream_t stream) {
  const dim3 grid(blocks_for(hidden, kMoeWarps), static_cast<unsigned>(n));
  launch(moe_down_kernel, grid, kMoeWarps * kWarp, 0, stream, h, inter, ids, weights, top_k, down, hidden, out);
}

}  // namespace kettle::cuda
