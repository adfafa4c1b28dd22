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

constexpr int kMaxExpertsPerLane = kMaxRoutedExperts / kWarp;
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

// One warp per token; lane l holds the logits of experts l, l + 32, ... in registers
// (no local arrays: a chosen expert is a bit in its lane's mask). Selection runs in
// descending probability (ties to the lower index); the chosen are then written in
// expert order, as transformers' index_add_ sums them, each lane placing its own.
__global__ void route_top_k_kernel(const float* __restrict__ logits, int n_experts, int top_k, bool renormalize,
                                   int32_t* ids, float* weights) {
  grid_wait();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* l = logits + t * n_experts;
  float v[kMaxExpertsPerLane];
  float big = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int e = lane + i * kWarp;
    v[i] = e < n_experts ? l[e] : -INFINITY;
    big = fmaxf(big, v[i]);
  }
  big = warp_max(big);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i)
    if (lane + i * kWarp < n_experts) sum += expf(v[i] - big);
  sum = warp_sum(sum);
  uint32_t taken = 0;
  float top_sum = 0.0f;  // in selection order, as lane 0 adds them
  for (int s = 0; s < top_k; ++s) {
    float best = -INFINITY;
    int best_e = n_experts;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < n_experts && !(taken >> i & 1u) && (v[i] > best || (v[i] == best && e < best_e))) {
        best = v[i];
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
    if (best_e % kWarp == lane) taken |= 1u << (best_e / kWarp);
    top_sum += expf(best - big) / sum;
  }
  // Expert order: experts i·32 + lane ascend with i, then lane.
  int placed = 0;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const bool mine = taken >> i & 1u;
    const unsigned chosen = __ballot_sync(0xffffffffu, mine);
    if (mine) {
      const int slot = placed + __popc(chosen & ((1u << lane) - 1u));
      const float prob = expf(v[i] - big) / sum;
      ids[t * top_k + slot] = lane + i * kWarp;
      weights[t * top_k + slot] = renormalize ? prob / top_sum : prob;
    }
    placed += __popc(chosen);
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
// The slots' weight rows are short (inter), so a warp reads kSlotsInFlight slots' rows at
// once rather than one dot product's round trip after another.
constexpr int kSlotsInFlight = 4;

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
  for (int s0 = 0; s0 < top_k; s0 += kSlotsInFlight) {
    float dots[kSlotsInFlight];
    if ((inter & 7) == 0) {
      const uint4* w[kSlotsInFlight];
      const float4* x[kSlotsInFlight];
#pragma unroll
      for (int u = 0; u < kSlotsInFlight; ++u) {
        const int64_t pair = t * top_k + min(s0 + u, top_k - 1);
        w[u] = reinterpret_cast<const uint4*>(down[ids[pair]] + row * inter);
        x[u] = reinterpret_cast<const float4*>(h + pair * inter);
        dots[u] = 0.0f;
      }
      for (int c = lane; c < inter / 8; c += kWarp) {
        uint4 wv[kSlotsInFlight];
#pragma unroll
        for (int u = 0; u < kSlotsInFlight; ++u) wv[u] = load_stream(w[u] + c);
#pragma unroll
        for (int u = 0; u < kSlotsInFlight; ++u) dots[u] += dot8(wv[u], x[u][2 * c], x[u][2 * c + 1]);
      }
#pragma unroll
      for (int u = 0; u < kSlotsInFlight; ++u) dots[u] = warp_sum(dots[u]);
    } else {
#pragma unroll
      for (int u = 0; u < kSlotsInFlight; ++u) {
        const int64_t pair = t * top_k + min(s0 + u, top_k - 1);
        dots[u] = row_dot(down[ids[pair]] + row * inter, h + pair * inter, static_cast<int>(inter), lane);
      }
    }
#pragma unroll
    for (int u = 0; u < kSlotsInFlight; ++u)
      if (s0 + u < top_k) sum += dots[u] * weights[t * top_k + s0 + u];
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
