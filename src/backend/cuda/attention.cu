// Attention over the KV cache, split-K ("flash-decoding"): the keys of each
// query are cut into chunks; a block scores one chunk for G query heads that
// share a KV head (GQA: the K/V rows are read once for the group), keeping an
// online softmax (running max, sum, weighted V) per warp; a second kernel
// merges the chunks. One chunk only: the block writes the output directly.
// Query t sees its sequence's logical rows [0, positions[t]] (its sliding
// window when set), read through its own block table (paged KV, any table
// stride), with Gemma-2 score softcapping; scores and softmax in f32.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kAttnWarps = 8;
// Kernels are built for D = 1, 2, 4, 8 head dims per lane: head_dim ≤ 256.
constexpr int kKeysPerIter = 4;     // K/V rows each warp loads before using them

// Short caches fit one chunk (no merge); long ones split into 256-key chunks.
int chunk_keys(int64_t) { return 256; }

template <int G, int D>
__global__ void __launch_bounds__(kAttnWarps* kWarp)
    attention_chunk_kernel(const float* __restrict__ q, int64_t ldq, Pages kv, const int32_t* __restrict__ positions,
                           AttentionParams p, int chunk, int splits, float* out, int64_t ldo, float* partial,
                           unsigned* arrivals) {
  grid_wait();
  __shared__ float sm_m[kAttnWarps][G], sm_l[kAttnWarps][G];
  __shared__ float sm_acc[kAttnWarps][G][D * kWarp];
  const int split = blockIdx.x;
  const int head0 = blockIdx.y * G;
  const int kvh = head0 / (p.n_heads / p.n_kv_heads);
  const int64_t t = blockIdx.z;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hd = p.head_dim;
  const int64_t pos = positions[t];
  const int64_t first = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : int64_t{0};
  const int64_t begin = max(first, static_cast<int64_t>(split) * chunk);
  const int64_t end = min(pos + 1, static_cast<int64_t>(split + 1) * chunk);

  float qv[G][D], acc[G][D], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int d = lane + i * kWarp;
      qv[g][i] = d < hd ? q[t * ldq + static_cast<int64_t>(head0 + g) * hd + d] : 0.0f;
      acc[g][i] = 0.0f;
    }
  }
  const float* k_base = kv.k + static_cast<int64_t>(kvh) * hd;
  const float* v_base = kv.v + static_cast<int64_t>(kvh) * hd;
  const int32_t* table = kv.table(t);
  for (int64_t j0 = begin + warp * kKeysPerIter; j0 < end; j0 += kAttnWarps * kKeysPerIter) {
    float kr[kKeysPerIter][D], vr[kKeysPerIter][D];
#pragma unroll
    for (int u = 0; u < kKeysPerIter; ++u) {
      const int64_t j = j0 + u;
      const int64_t row = j < end ? kv.row(table, static_cast<int>(j)) * kv.ld : 0;
#pragma unroll
      for (int i = 0; i < D; ++i) {
        const int d = lane + i * kWarp;
        const bool ok = j < end && d < hd;
        kr[u][i] = ok ? k_base[row + d] : 0.0f;
        vr[u][i] = ok ? v_base[row + d] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kKeysPerIter; ++u) {
      if (j0 + u >= end) break;  // uniform across the warp
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < D; ++i) s = fmaf(qv[g][i], kr[u][i], s);
        s = warp_sum(s) * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
        const float m_new = fmaxf(m[g], s);
        const float correction = expf(m[g] - m_new), weight = expf(s - m_new);
        l[g] = l[g] * correction + weight;
#pragma unroll
        for (int i = 0; i < D; ++i) acc[g][i] = fmaf(acc[g][i], correction, weight * vr[u][i]);
        m[g] = m_new;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < D; ++i) sm_acc[warp][g][lane + i * kWarp] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
    const int g = idx / hd, d = idx % hd;
    float big = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_l[w][g] > 0.0f) big = fmaxf(big, sm_m[w][g]);
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (sm_l[w][g] <= 0.0f) continue;
      const float f = expf(sm_m[w][g] - big);
      sum += sm_l[w][g] * f;
      value += sm_acc[w][g][d] * f;
    }
    const int head = head0 + g;
    if (splits == 1) {
      out[t * ldo + static_cast<int64_t>(head) * hd + d] = sum > 0.0f ? value / sum : 0.0f;
    } else {
      float* slot = partial + ((t * p.n_heads + head) * splits + split) * (hd + 2);
      slot[d] = value;
      if (d == 0) {
        slot[hd] = big;
        slot[hd + 1] = sum;
      }
    }
  }
  if (splits == 1) return;
  // The last chunk block of this (query, head group) to finish merges all chunks, so
  // no second launch is needed; it re-arms the counter for the next step.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  unsigned* arrival = arrivals + t * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) last = atomicAdd(arrival, 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
    const int g = idx / hd, d = idx % hd, head = head0 + g;
    const float* slots = partial + (t * p.n_heads + head) * splits * (hd + 2);
    float big = -INFINITY;
    for (int s = 0; s < splits; ++s) {
      const volatile float* slot = slots + s * (hd + 2);
      if (slot[hd + 1] > 0.0f) big = fmaxf(big, slot[hd]);
    }
    float sum = 0.0f, value = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const volatile float* slot = slots + s * (hd + 2);
      if (slot[hd + 1] <= 0.0f) continue;
      const float f = expf(slot[hd] - big);
      sum += slot[hd + 1] * f;
      value += slot[d] * f;
    }
    out[t * ldo + static_cast<int64_t>(head) * hd + d] = sum > 0.0f ? value / sum : 0.0f;
  }
  if (threadIdx.x == 0) *arrival = 0;
}

int heads_per_block(const AttentionParams& p) {
  const int group = p.n_heads / p.n_kv_heads;
  for (int g : {4, 3, 2}) if (group % g == 0) return g;
  return 1;
}

}  // namespace

int64_t attention_partial_floats(int64_t n, int64_t max_kv, const AttentionParams& p) {
  const int64_t splits = (max_kv + chunk_keys(n) - 1) / chunk_keys(n);
  return splits > 1 ? n * p.n_heads * splits * (p.head_dim + 2) : 0;
}

void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
               const AttentionParams& p, float* out, int64_t ldo, float* partial, unsigned* arrivals,
               cudaStream_t stream) {
  if (n == 0) return;
  const int chunk = chunk_keys(n);
  const int splits = static_cast<int>(std::max<int64_t>(1, (max_kv + chunk - 1) / chunk));
  const int g = heads_per_block(p);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.n_heads / g), static_cast<unsigned>(n));
  const int threads = kAttnWarps * kWarp;
  const int d = p.head_dim <= 32 ? 1 : p.head_dim <= 64 ? 2 : p.head_dim <= 128 ? 4 : 8;
  const auto run = [&](auto kernel) {
    launch(kernel, grid, threads, 0, stream, q, ldq, pages_of(kv), positions, p, chunk, splits, out, ldo, partial,
           arrivals);
  };
#define KETTLE_ATTENTION_CASE(G)                                \
  case G:                                                       \
    if (d == 1) run(attention_chunk_kernel<G, 1>);              \
    else if (d == 2) run(attention_chunk_kernel<G, 2>);         \
    else if (d == 4) run(attention_chunk_kernel<G, 4>);         \
    else run(attention_chunk_kernel<G, 8>);                     \
    break;
  switch (g) {
    KETTLE_ATTENTION_CASE(4)
    KETTLE_ATTENTION_CASE(3)
    KETTLE_ATTENTION_CASE(2)
    default: KETTLE_ATTENTION_CASE(1)
  }
#undef KETTLE_ATTENTION_CASE
}

}  // namespace kettle::cuda
