// Attention over the KV cache, split-K ("flash-decoding"): the keys of each
// query are cut into chunks of 128; a block scores one chunk for the G ≤ 16
// query heads that share a KV head (GQA: the K/V rows are read once for the
// group), each of its 4 warps one tile of 32 keys, on the tensor cores. A warp
// copies its tile's f16 key and value rows into shared memory with
// asynchronous 16-byte copies (all in flight at once: one memory round trip);
// then S = Q·Kᵀ and O = P·V are m16n8k16 MMAs (the G heads are the 16 rows;
// rows past G are zero), with Q and P each split into two f16 halves (x = hi +
// lo) so the products keep about 22 significant bits, as close to f32 as the
// CUDA-core kernel this replaced; scores, softmax and sums stay in f32. The
// warps' softmax states merge in shared memory, and the chunks of a query in
// the last block to finish. The chunk size never depends on the batch, so a
// query's sums run in the same order alone or batched. Query t sees its
// sequence's logical rows [0, positions[t]] (its sliding window when set),
// read through its own block table (paged KV, any table stride), with Gemma-2
// score softcapping.
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
constexpr int kMmaRows = 16;                // query heads per block at most: the MMA's M
constexpr int kMergeSlots = 64;             // chunks whose merge weights fit in shared memory

// Halves per shared-memory row (K, V and Q alike): head_dim rounded up to the MMA's 16,
// plus 8, so rows start 16-byte aligned and the 8 rows of one ldmatrix 8x8 matrix fall
// in 8 different bank groups.
__host__ __device__ constexpr int padded_row(int hd) {
  return (hd + 15) / 16 * 16 + 8;
}

// Dynamic shared memory of one block: K tiles [warps][32][row], V tiles likewise, then
// Q's hi and lo halves [G + 1][row] each (row G is zeros: MMA rows past G read it).
// After the MMAs the tile area holds the merge's floats: the warps' states
// (4 · group · hd), then the chunk weights (group · kMergeSlots + 2 group), at most
// 128 · row floats for any group ≤ 16.
size_t block_bytes(int hd, int group) {
  return static_cast<size_t>(2 * kChunk + 2 * (group + 1)) * padded_row(hd) * sizeof(__half);
}

__device__ __forceinline__ void copy16_async(void* smem, const void* global) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}

__device__ __forceinline__ void copies_done() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Four 8x8 f16 matrices from shared memory, lanes 8i..8i+7 giving matrix i's row
// addresses; kTransposed (.trans) hands each lane a column pair instead of a row pair.
template <bool kTransposed = false>
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const __half* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// c[16x8] += a[16x16] · b[16x8], f16 inputs, f32 accumulators (PTX fragment layouts:
// lane l holds c rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a packed f16 pair (hi) and the pair of what rounding left over (lo).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const __half2 l = __floats2half2_rn(a - __low2float(h), b - __high2float(h));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// This warp's tile rows (pool element offsets; -1: not visible) copied into shared
// memory, zeros for invisible keys and for the dims past head_dim (the pool's unused
// rows may hold anything, NaN included): 16-byte pieces dealt round the lanes, or
// element by element when rows are not 16-byte aligned.
__device__ __forceinline__ void copy_tile(const __half* __restrict__ src, const int64_t* rows, int hd, bool aligned,
                                          __half* tile, int lane) {
  const int stride = padded_row(hd), width = (hd + 15) / 16 * 16;
  if (aligned) {
    const int pieces = width / 8, real = hd / 8;
    for (int i = lane; i < kWarp * pieces; i += kWarp) {
      const int key = i / pieces, part = i % pieces;
      __half* dst = tile + key * stride + part * 8;
      if (rows[key] >= 0 && part < real)
        copy16_async(dst, src + rows[key] + part * 8);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  for (int i = lane; i < kWarp * width; i += kWarp) {
    const int key = i / width, d = i % width;
    tile[key * stride + d] = rows[key] >= 0 && d < hd ? src[rows[key] + d] : __float2half(0.0f);
  }
}

// One chunk's attention for heads [head0, head0 + group) of query t, keys [begin, end)
// (not empty): the block's result into the query's output (splits == 1) or the chunk's
// slot of partial (value, max, mass). KT bounds the 16-dim steps of head_dim (≤ 16 KT).
template <int KT>
__device__ __forceinline__ void attend_chunk(const float* __restrict__ q, int64_t ldq, const Pages& kv,
                                             const AttentionParams& p, int group, int splits, int64_t t, int split,
                                             int head0, int64_t begin, int64_t end, float* out, int64_t ldo,
                                             float* partial) {
  extern __shared__ __align__(16) __half smem[];
  __shared__ float sm_m[kAttnWarps][kMmaRows], sm_l[kAttnWarps][kMmaRows];
  __shared__ int64_t sm_row[kAttnWarps][kWarp];
  const int kvh = head0 / (p.n_heads / p.n_kv_heads);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hd = p.head_dim, stride = padded_row(hd), steps = (hd + 15) / 16;
  __half* k_tile = smem + warp * kWarp * stride;
  __half* v_tile = smem + (kAttnWarps + warp) * kWarp * stride;
  __half* q_hi = smem + 2 * kChunk * stride;
  __half* q_lo = q_hi + (group + 1) * stride;
  const int32_t* table = kv.table(t);

  // This warp's tile: keys [j0, j0 + 32) ∩ [begin, end); lane i fetches key j0 + i's row.
  const int64_t j0 = static_cast<int64_t>(split) * kChunk + warp * kWarp;
  {
    const int64_t j = j0 + lane;
    const int64_t head_offset = static_cast<int64_t>(kvh) * hd;
    sm_row[warp][lane] = j >= begin && j < end ? kv.row(table, static_cast<int>(j)) * kv.ld + head_offset : -1;
  }
  __syncwarp();
  grid_wait();  // the cache rows and q come from the previous kernel
  const bool aligned = (hd & 7) == 0 && (kv.ld & 7) == 0;
  copy_tile(kv.k, sm_row[warp], hd, aligned, k_tile, lane);
  copy_tile(kv.v, sm_row[warp], hd, aligned, v_tile, lane);
  // q (pre-scaled) as hi + lo f16 rows while the copies fly; row `group` stays zero.
  const int width = steps * 16;
  for (int i = threadIdx.x; i < (group + 1) * width; i += blockDim.x) {
    const int g = i / width, d = i % width;
    const float x = g < group && d < hd ? q[t * ldq + static_cast<int64_t>(head0 + g) * hd + d] * p.scale : 0.0f;
    const __half h = __float2half_rn(x);
    q_hi[g * stride + d] = h;
    q_lo[g * stride + d] = __float2half_rn(x - __half2float(h));
  }
  copies_done();
  __syncthreads();

  // S = Q·Kᵀ: 16 head rows × the tile's 32 keys as four 8-key MMA tiles.
  float s[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  const int q_row = min(lane % 16, group);  // rows past G read the zero row
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    if (ks >= steps) break;
    uint32_t a_hi[4], a_lo[4];
    load_matrices(a_hi, q_hi + q_row * stride + ks * 16 + (lane / 16) * 8);
    load_matrices(a_lo, q_lo + q_row * stride + ks * 16 + (lane / 16) * 8);
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      uint32_t b[4];  // keys 16 pair + [0, 8) and + [8, 16), dims ks 16 + [0, 8) and + [8, 16)
      load_matrices(b, k_tile + (pair * 16 + lane % 8 + (lane / 16) * 8) * stride + ks * 16 + ((lane / 8) % 2) * 8);
      mma(s[2 * pair], a_hi, b[0], b[1]);
      mma(s[2 * pair], a_lo, b[0], b[1]);
      mma(s[2 * pair + 1], a_hi, b[2], b[3]);
      mma(s[2 * pair + 1], a_lo, b[2], b[3]);
    }
  }

  // Softmax over the tile per row: this lane holds rows lane/4 (s[j][0..1]) and
  // lane/4 + 8 (s[j][2..3]) at keys 8j + 2(lane % 4) + {0, 1}; a row's 4 lanes reduce.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  bool seen[4][2];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t key = j0 + j * 8 + (lane % 4) * 2 + e;
      seen[j][e] = key >= begin && key < end;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[j][2 * h + e];
        if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
        x = seen[j][e] ? x : -INFINITY;
        m[h] = fmaxf(m[h], x);
      }
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
    m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[j][2 * h + e];
        x = seen[j][e] ? expf(x - m[h]) : 0.0f;
        l[h] += x;
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }

  // O = P·V: the weights of 16 keys form an A fragment straight from two S tiles.
  float o[2 * KT][4];
#pragma unroll
  for (int n = 0; n < 2 * KT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t p_hi[4], p_lo[4];
    split_pair(s[2 * kk][0], s[2 * kk][1], p_hi[0], p_lo[0]);
    split_pair(s[2 * kk][2], s[2 * kk][3], p_hi[1], p_lo[1]);
    split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], p_hi[2], p_lo[2]);
    split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], p_hi[3], p_lo[3]);
#pragma unroll
    for (int dp = 0; dp < KT; ++dp) {
      if (dp >= steps) break;
      uint32_t b[4];  // keys 16 kk + [0, 8) and + [8, 16), dims 16 dp + [0, 8) and + [8, 16)
      load_matrices<true>(b, v_tile + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * stride + dp * 16 + (lane / 16) * 8);
      mma(o[2 * dp], p_hi, b[0], b[1]);
      mma(o[2 * dp], p_lo, b[0], b[1]);
      mma(o[2 * dp + 1], p_hi, b[2], b[3]);
      mma(o[2 * dp + 1], p_lo, b[2], b[3]);
    }
  }

  // The warps' states into shared memory (the tile area is free once every warp is here).
  __syncthreads();
  float* sm_acc = reinterpret_cast<float*>(smem);  // [warps][group][hd]
  const int r = lane / 4;
  if (lane % 4 == 0) {
    if (r < group) sm_m[warp][r] = m[0], sm_l[warp][r] = l[0];
    if (r + 8 < group) sm_m[warp][r + 8] = m[1], sm_l[warp][r + 8] = l[1];
  }
#pragma unroll
  for (int n = 0; n < 2 * KT; ++n) {
    if (n >= 2 * steps) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r + 8 * h;
      if (row >= group) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + (lane % 4) * 2 + e;
        if (d < hd) sm_acc[(warp * group + row) * hd + d] = o[n][2 * h + e];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
    const int g = idx / hd, d = idx % hd;
    float big = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_l[w][g] > 0.0f) big = fmaxf(big, sm_m[w][g]);
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (sm_l[w][g] <= 0.0f) continue;
      const float f = expf(sm_m[w][g] - big);
      sum += sm_l[w][g] * f;
      value += sm_acc[(w * group + g) * hd + d] * f;
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
}

// One block: chunk blockIdx.x of query blockIdx.z for heads [group · blockIdx.y, + group).
// A chunk past the query's keys (the step's bound is a bucket) only marks its slot empty.
template <int KT>
__global__ void __launch_bounds__(kAttnWarps* kWarp, 3)
    attention_chunk_kernel(const float* __restrict__ q, int64_t ldq, Pages kv, const int32_t* __restrict__ positions,
                           AttentionParams p, int group, int splits, float* out, int64_t ldo, float* partial,
                           unsigned* arrivals) {
  const int split = blockIdx.x;
  const int head0 = blockIdx.y * group;
  const int64_t t = blockIdx.z;
  const int hd = p.head_dim;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // Positions and block tables are the step's inputs, uploaded before its first kernel,
  // so they are read before grid_wait, overlapping the previous kernel's tail.
  const int64_t pos = positions[t];
  const int64_t first = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : int64_t{0};
  const int64_t begin = max(first, static_cast<int64_t>(split) * kChunk);
  const int64_t end = min(pos + 1, static_cast<int64_t>(split + 1) * kChunk);
  if (begin < end) {
    attend_chunk<KT>(q, ldq, kv, p, group, splits, t, split, head0, begin, end, out, ldo, partial);
  } else {
    grid_wait();
    for (int i = threadIdx.x; splits > 1 && i < group * (hd + 2); i += blockDim.x) {
      const int g = i / (hd + 2), d = i % (hd + 2);
      partial[((t * p.n_heads + head0 + g) * splits + split) * (hd + 2) + d] = d == hd ? -INFINITY : 0.0f;
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
  // with at most kMergeSlots chunks each chunk's weight exp(m - big) / total is kept too
  // (in the tile area, no longer read).
  extern __shared__ __align__(16) __half smem[];
  float* sm_w = reinterpret_cast<float*>(smem);  // [group][kMergeSlots]
  float* sm_big = sm_w + group * kMergeSlots;    // [group]
  float* sm_sum = sm_big + group;                // [group]
  for (int g = warp; g < group; g += kAttnWarps) {
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
        sm_w[g * kMergeSlots + c] = sum > 0.0f ? expf(__ldcg(slots + c * (hd + 2) + hd) - big) / sum : 0.0f;
  }
  __syncthreads();
  if (splits <= kMergeSlots) {
    for (int idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
      const int g = idx / hd, d = idx % hd, head = head0 + g;
      const float* slots = partial + (t * p.n_heads + head) * splits * (hd + 2);
      float value = 0.0f;
#pragma unroll 8
      for (int c = 0; c < splits; ++c) value = fmaf(__ldcg(slots + c * (hd + 2) + d), sm_w[g * kMergeSlots + c], value);
      out[t * ldo + static_cast<int64_t>(head) * hd + d] = value;
    }
    if (threadIdx.x == 0) *arrival = 0;
    return;
  }
  // Then every output element: its chunks' values, weighted, with no branch on the loads
  // (an empty chunk has mass 0 and max -inf: weight exp(-inf) = 0).
  for (int idx = threadIdx.x; idx < group * hd; idx += blockDim.x) {
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

// Query heads per block: the largest divisor of the GQA group that fits the MMA's rows.
int heads_per_block(const AttentionParams& p) {
  const int group = p.n_heads / p.n_kv_heads;
  for (int g = std::min(group, kMmaRows); g > 1; --g)
    if (group % g == 0) return g;
  return 1;
}

// Above 48 KB of dynamic shared memory a kernel must opt in, once per kernel (every
// instantiation has the same type, so a static per call site would not do).
void allow_tile_memory(const void* kernel) {
  static std::mutex mutex;
  static std::set<const void*> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!allowed.insert(kernel).second) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(block_bytes(256, kMmaRows)));
  // All of the unified L1 as shared memory: three blocks of head_dim 128 per SM.
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
  const int group = heads_per_block(p);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.n_heads / group), static_cast<unsigned>(n));
  const auto run = [&](auto kernel) {
    allow_tile_memory(reinterpret_cast<const void*>(kernel));
    launch(kernel, grid, kAttnWarps * kWarp, block_bytes(p.head_dim, group), stream, q, ldq, pages_of(kv), positions, p,
           group, splits, out, ldo, partial, arrivals);
  };
  if (p.head_dim <= 32)
    run(attention_chunk_kernel<2>);
  else if (p.head_dim <= 64)
    run(attention_chunk_kernel<4>);
  else if (p.head_dim <= 128)
    run(attention_chunk_kernel<8>);
  else
    run(attention_chunk_kernel<16>);
}

}  // namespace kettle::cuda
