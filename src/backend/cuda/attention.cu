// Attention over the KV cache, split-K ("flash-decoding"): the keys of each
// query are cut into chunks of 128; a block scores one chunk for G query heads
// that share a KV head (GQA: the K/V rows are read once for the group), each
// of its 4 warps one tile of 32 keys. A warp first copies its tile's f16 key
// and value rows into shared memory with asynchronous 16-byte copies (all of
// them in flight at once: one memory round trip per tile, few registers);
// then a lane owns one key for the scores (its key row against q, both in
// shared memory: no shuffles per key) and head dims for P·V. The warps'
// softmax states merge in shared memory, and the chunks of a query in the
// last block to finish. The chunk size never depends on the batch, so a
// query's sums run in the same order alone or batched. Query t sees its
// sequence's logical rows [0, positions[t]] (its sliding window when set),
// read through its own block table (paged KV, any table stride), with Gemma-2
// score softcapping; scores and softmax in f32.
#include <algorithm>
#include <mutex>
#include <set>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kChunk = kAttnWarps * kWarp;  // keys per block: one tile of 32 per warp
// Kernels are built for D = 1, 2, 4, 8 head dims per lane (head_dim ≤ 32 D ≤ 256) and
// G heads per block with G · D ≤ 32.
constexpr int kMaxGD = 32;

// Halves per shared-memory K/V row: head_dim rounded up to 8, plus 8, so rows start
// 16-byte aligned and the 8 lanes of a quarter warp reading 8 different rows at the
// same column hit 8 different bank groups.
__host__ __device__ constexpr int padded_row(int hd) { return (hd + 7) / 8 * 8 + 8; }

// Dynamic shared memory of one block: K then V tiles, [warps][32 keys][padded_row].
size_t tile_bytes(int hd) { return size_t{2} * kAttnWarps * kWarp * padded_row(hd) * sizeof(__half); }

__device__ __forceinline__ void copy16_async(void* smem, const void* global) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}

__device__ __forceinline__ void copies_done() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Eight f16 values (16 bytes) as floats.
__device__ __forceinline__ void halves8(uint4 w, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// This warp's tile rows (pool element offsets; -1: not visible) copied into shared
// memory: 16-byte pieces dealt round the lanes, or element by element when rows are not
// 16-byte aligned (head_dim or the row stride not a multiple of 8).
__device__ __forceinline__ void copy_tile(const __half* __restrict__ src, const int64_t* rows, int hd, bool aligned,
                                          __half* tile, int lane) {
  const int stride = padded_row(hd);
  if (aligned) {
    const int pieces = hd / 8;
    for (int i = lane; i < kWarp * pieces; i += kWarp) {
      const int key = i / pieces, part = i % pieces;
      if (rows[key] >= 0) copy16_async(tile + key * stride + part * 8, src + rows[key] + part * 8);
    }
    return;
  }
  for (int i = lane; i < kWarp * hd; i += kWarp) {
    const int key = i / hd, d = i % hd;
    if (rows[key] >= 0) tile[key * stride + d] = src[rows[key] + d];
  }
}

// q·k for G heads: k one f16 row in shared memory, q [G][qld] floats in shared memory
// (every lane reads the same q address: a broadcast).
template <int G, int D>
__device__ __forceinline__ void score_row(const __half* k, const float* qs, int qld, int hd, float (&s)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) s[g] = 0.0f;
  const int whole = hd / 8 * 8;
#pragma unroll
  for (int d = 0; d < 32 * D; d += 8) {
    if (d >= whole) break;
    float f[8];
    halves8(*reinterpret_cast<const uint4*>(k + d), f);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float4 a = *reinterpret_cast<const float4*>(qs + g * qld + d);
      const float4 b = *reinterpret_cast<const float4*>(qs + g * qld + d + 4);
      s[g] = fmaf(a.x, f[0], s[g]);
      s[g] = fmaf(a.y, f[1], s[g]);
      s[g] = fmaf(a.z, f[2], s[g]);
      s[g] = fmaf(a.w, f[3], s[g]);
      s[g] = fmaf(b.x, f[4], s[g]);
      s[g] = fmaf(b.y, f[5], s[g]);
      s[g] = fmaf(b.z, f[6], s[g]);
      s[g] = fmaf(b.w, f[7], s[g]);
    }
  }
  for (int d = whole; d < hd; ++d) {
    const float kd = __half2float(k[d]);
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = fmaf(qs[g * qld + d], kd, s[g]);
  }
}

// This lane's D head dims [lane D, lane D + D) of one f16 row in shared memory.
template <int D>
__device__ __forceinline__ void row_dims(const __half* v, int lane, int hd, float (&out)[D]) {
  const int d0 = lane * D;
  if (d0 + D <= hd) {
    if constexpr (D == 8) {
      float f[8];
      halves8(*reinterpret_cast<const uint4*>(v + d0), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = f[i];
      return;
    } else if constexpr (D == 4) {
      const uint2 w = *reinterpret_cast<const uint2*>(v + d0);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
      out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
      return;
    } else if constexpr (D == 2) {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(v + d0));
      out[0] = a.x, out[1] = a.y;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < D; ++i) out[i] = d0 + i < hd ? __half2float(v[d0 + i]) : 0.0f;
}

template <int G, int D>
__global__ void __launch_bounds__(kAttnWarps* kWarp)
    attention_chunk_kernel(const float* __restrict__ q, int64_t ldq, Pages kv, const int32_t* __restrict__ positions,
                           AttentionParams p, int splits, float* out, int64_t ldo, float* partial,
                           unsigned* arrivals) {
  constexpr int kQld = 32 * D + 4;  // q row stride in shared memory (16-byte aligned)
  extern __shared__ __align__(16) __half kv_tiles[];  // K tiles, then V tiles
  __shared__ __align__(16) float qs[G * kQld];
  __shared__ float sm_m[kAttnWarps][G], sm_l[kAttnWarps][G];
  __shared__ float sm_acc[kAttnWarps][G][D * kWarp];
  __shared__ float sm_p[kAttnWarps][kWarp][G];
  __shared__ int64_t sm_row[kAttnWarps][kWarp];
  const int split = blockIdx.x;
  const int head0 = blockIdx.y * G;
  const int kvh = head0 / (p.n_heads / p.n_kv_heads);
  const int64_t t = blockIdx.z;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hd = p.head_dim, stride = padded_row(hd);
  __half* k_tile = kv_tiles + warp * kWarp * stride;
  __half* v_tile = kv_tiles + (kAttnWarps + warp) * kWarp * stride;
  const int32_t* table = kv.table(t);
  grid_wait();
  const int64_t pos = positions[t];
  const int64_t first = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : int64_t{0};
  const int64_t begin = max(first, static_cast<int64_t>(split) * kChunk);
  const int64_t end = min(pos + 1, static_cast<int64_t>(split + 1) * kChunk);

  // This warp's tile: keys [j0, j0 + 32) ∩ [begin, end), lane = key j0 + lane.
  const int64_t j0 = static_cast<int64_t>(split) * kChunk + warp * kWarp, j = j0 + lane;
  const bool visible = j >= begin && j < end;
  const int64_t head_offset = static_cast<int64_t>(kvh) * hd;
  sm_row[warp][lane] = visible ? kv.row(table, static_cast<int>(j)) * kv.ld + head_offset : -1;
  __syncwarp();
  const bool aligned = (hd & 7) == 0 && (kv.ld & 7) == 0;
  copy_tile(kv.k, sm_row[warp], hd, aligned, k_tile, lane);
  copy_tile(kv.v, sm_row[warp], hd, aligned, v_tile, lane);
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {  // q while the copies fly
    const int g = i / hd, d = i % hd;
    qs[g * kQld + d] = q[t * ldq + static_cast<int64_t>(head0 + g) * hd + d];
  }
  copies_done();
  __syncthreads();

  float s[G];
  if (visible) {
    score_row<G, D>(k_tile + lane * stride, qs, kQld, hd, s);
  } else {
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.0f;
  }
  float m[G], l[G], acc[G][D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float score = s[g] * p.scale;
    if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
    score = visible ? score : -INFINITY;
    m[g] = warp_max(score);
    const float weight = visible ? expf(score - m[g]) : 0.0f;
    l[g] = warp_sum(weight);
    sm_p[warp][lane][g] = weight;
#pragma unroll
    for (int i = 0; i < D; ++i) acc[g][i] = 0.0f;
  }
  __syncwarp();
  // P·V over the tile's visible keys (a contiguous run of lanes; other rows were not copied).
  const unsigned mask = __ballot_sync(0xffffffffu, visible);
  if (mask != 0) {
    const int lo = __ffs(mask) - 1, hi = 32 - __clz(mask);
    for (int r0 = lo; r0 < hi; r0 += 4) {
      float v[4][D];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (r0 + u < hi) row_dims<D>(v_tile + (r0 + u) * stride, lane, hd, v[u]);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (r0 + u >= hi) break;
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float pr = sm_p[warp][r0 + u][g];
#pragma unroll
          for (int i = 0; i < D; ++i) acc[g][i] = fmaf(pr, v[u][i], acc[g][i]);
        }
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
    for (int i = 0; i < D; ++i) sm_acc[warp][g][lane * D + i] = acc[g][i];
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
  // Per head, the chunks' largest max and total mass: one warp per head, lanes over chunks;
  // with at most kMergeSlots chunks each chunk's weight exp(m - big) / total is kept too.
  constexpr int kMergeSlots = 64;
  __shared__ float sm_big[G], sm_sum[G], sm_w[G][kMergeSlots];
  for (int g = warp; g < G; g += kAttnWarps) {
    const float* slots = partial + (t * p.n_heads + head0 + g) * splits * (hd + 2);
    float big = -INFINITY;
    for (int c = lane; c < splits; c += kWarp)
      if (__ldcg(slots + c * (hd + 2) + hd + 1) > 0.0f) big = fmaxf(big, __ldcg(slots + c * (hd + 2) + hd));
    big = warp_max(big);
    float sum = 0.0f;
    for (int c = lane; c < splits; c += kWarp) {
      const float l_c = __ldcg(slots + c * (hd + 2) + hd + 1);
      if (l_c > 0.0f) sum += l_c * expf(__ldcg(slots + c * (hd + 2) + hd) - big);
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      sm_big[g] = big;
      sm_sum[g] = sum;
    }
    if (splits <= kMergeSlots)
      for (int c = lane; c < splits; c += kWarp)
        sm_w[g][c] = sum > 0.0f ? expf(__ldcg(slots + c * (hd + 2) + hd) - big) / sum : 0.0f;
  }
  __syncthreads();
  if (splits <= kMergeSlots) {
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
      const int g = idx / hd, d = idx % hd, head = head0 + g;
      const float* slots = partial + (t * p.n_heads + head) * splits * (hd + 2);
      float value = 0.0f;
#pragma unroll 8
      for (int c = 0; c < splits; ++c) value = fmaf(__ldcg(slots + c * (hd + 2) + d), sm_w[g][c], value);
      out[t * ldo + static_cast<int64_t>(head) * hd + d] = value;
    }
    if (threadIdx.x == 0) *arrival = 0;
    return;
  }
  // Then every output element: its chunks' values, weighted, with no branch on the loads
  // (an empty chunk has mass 0 and max -inf: weight exp(-inf) = 0).
  for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
    const int g = idx / hd, d = idx % hd, head = head0 + g;
    const float* slots = partial + (t * p.n_heads + head) * splits * (hd + 2);
    const float big = sm_big[g], sum = sm_sum[g];
    float value = 0.0f;
    if (sum > 0.0f)
      for (int c = 0; c < splits; ++c) {
        const float* slot = slots + c * (hd + 2);
        value += __ldcg(slot + d) * expf(__ldcg(slot + hd) - big);
      }
    out[t * ldo + static_cast<int64_t>(head) * hd + d] = sum > 0.0f ? value / sum : 0.0f;
  }
  if (threadIdx.x == 0) *arrival = 0;
}

int dims_per_lane(const AttentionParams& p) {
  return p.head_dim <= 32 ? 1 : p.head_dim <= 64 ? 2 : p.head_dim <= 128 ? 4 : 8;
}

int heads_per_block(const AttentionParams& p) {
  const int group = p.n_heads / p.n_kv_heads;
  for (int g : {8, 4, 3, 2})
    if (group % g == 0 && g * dims_per_lane(p) <= kMaxGD) return g;
  return 1;
}

// Above 48 KB of dynamic shared memory a kernel must opt in, once per kernel (every
// instantiation has the same type, so a static per call site would not do).
void allow_tile_memory(const void* kernel) {
  static std::mutex mutex;
  static std::set<const void*> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!allowed.insert(kernel).second) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(tile_bytes(256)));
  // All of the unified L1 as shared memory: two blocks of head_dim 128 per SM, not one.
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

}  // namespace

int64_t attention_partial_floats(int64_t n, int64_t max_kv, const AttentionParams& p) {
  const int64_t splits = (max_kv + kChunk - 1) / kChunk;
  return splits > 1 ? n * p.n_heads * splits * (p.head_dim + 2) : 0;
}

void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
               const AttentionParams& p, float* out, int64_t ldo, float* partial, unsigned* arrivals,
               cudaStream_t stream) {
  if (n == 0) return;
  const int splits = static_cast<int>(std::max<int64_t>(1, (max_kv + kChunk - 1) / kChunk));
  const int g = heads_per_block(p);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.n_heads / g), static_cast<unsigned>(n));
  const int threads = kAttnWarps * kWarp;
  const int d = dims_per_lane(p);
  const size_t smem = tile_bytes(p.head_dim);
  const auto run = [&](auto kernel) {
    allow_tile_memory(reinterpret_cast<const void*>(kernel));
    launch(kernel, grid, threads, smem, stream, q, ldq, pages_of(kv), positions, p, splits, out, ldo, partial, arrivals);
  };
#define KETTLE_ATTENTION_CASE(G)                                \
  case G:                                                       \
    if (d == 1) run(attention_chunk_kernel<G, 1>);              \
    else if (d == 2) run(attention_chunk_kernel<G, 2>);         \
    else if (d == 4) run(attention_chunk_kernel<G, 4>);         \
    else run(attention_chunk_kernel<G, 8>);                     \
    break;
  switch (g) {
    case 8:  // G · D ≤ 32: D ≤ 4
      if (d == 1) run(attention_chunk_kernel<8, 1>);
      else if (d == 2) run(attention_chunk_kernel<8, 2>);
      else run(attention_chunk_kernel<8, 4>);
      break;
    KETTLE_ATTENTION_CASE(4)
    KETTLE_ATTENTION_CASE(3)
    KETTLE_ATTENTION_CASE(2)
    default: KETTLE_ATTENTION_CASE(1)
  }
#undef KETTLE_ATTENTION_CASE
}

}  // namespace kettle::cuda
