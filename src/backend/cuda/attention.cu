// Attention over the KV cache, split-K ("flash-decoding"): the keys of each
// query are cut into chunks of 128, doubled until at most 64 chunks cover
// them (a function of the query's own position); a block scores one chunk for
// the G ≤ 16 query heads that share a KV head (GQA: the K/V rows are read once
// for the group), its 4 warps walking the chunk in tiles of 32 keys, on the
// tensor cores. A warp copies its tile's f16 key and value rows into shared
// memory with asynchronous 16-byte copies (all in flight at once: one memory
// round trip), or decodes quantized rows into f16 there (kv_rows.cuh); then
// S = Q·Kᵀ and O = P·V are m16n8k16 MMAs (the G heads are
// the 16 rows; rows past G are zero), with Q and P each split into two f16
// halves (x = hi + lo) so the products keep about 22 significant bits, as
// close to f32 as the CUDA-core kernel this replaced; scores, softmax and sums
// stay in f32, a warp's state carried across its tiles (online softmax). The
// warps' states merge in shared memory, and the chunks of a query in the last
// block to finish. The chunking never depends on the batch, so a query's sums
// run in the same order alone or batched. Query t sees its sequence's logical
// rows [0, positions[t]] (its sliding window when set), read through its own
// block table (paged KV, any table stride), with Gemma-2 score softcapping.
#include <algorithm>
#include <mutex>
#include <set>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kChunk = kAttnWarps * kWarp;  // keys per block: one tile of 32 per warp
constexpr int kMmaRows = 16;                // query heads per block at most: the MMA's M
constexpr int kMaxSplits = 64;              // chunks per query at most (their merge weights sit in shared memory)

// Floats of one chunk's partial result: the head's values, its max and its mass, padded
// to a multiple of four so the merge reads each slot's values 16 bytes at a time.
__host__ __device__ constexpr int slot_floats(int hd) {
  return (hd + 2 + 3) / 4 * 4;
}

// Dynamic shared memory of one block: K tiles [warps][32][row], V tiles likewise, then
// Q's hi and lo halves [G + 1][row] each (row G is zeros: MMA rows past G read it).
// After the MMAs the tile area holds the merge's floats: the warps' states
// (4 · group · hd), then the chunk weights (group · kMaxSplits), at most 128 · row
// floats for any group ≤ 16.
__host__ __device__ inline size_t block_bytes(int hd, int group) {
  return static_cast<size_t>(2 * kChunk + 2 * (group + 1)) * padded_row(hd) * sizeof(__half);
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

// The keys one block of query at `pos` takes: 128 (one 32-key tile per warp) while the
// query's keys fit in kMaxSplits chunks, doubled until they do. A function of the query's
// own position alone, so its sums run in the same order alone or batched; long caches are
// read by at most kMaxSplits blocks per head group, each walking its chunk 128 keys at a time.
__device__ __forceinline__ int64_t chunk_keys(int64_t pos) {
  int64_t chunk = kChunk;
  while ((pos + chunk) / chunk > kMaxSplits) chunk *= 2;
  return chunk;
}

// A warp's online-softmax state over the tiles it has seen: this lane holds head rows
// lane/4 (h = 0) and lane/4 + 8 (h = 1), and of O the dims 8n + 2(lane % 4) + {0, 1}.
template <int KT>
struct WarpState {
  float o[2 * KT][4];
  float m[2], l[2];
};

// How a kernel reads its tiles' keys and values: f16 rows copied asynchronously; quantized
// rows decoded as they are loaded (kv_rows.cuh, every codec); or quantized rows staged —
// their raw bytes copied asynchronously, the next tile's in flight while this one's MMAs run,
// then decoded from shared memory (kv_stages codecs, heads up to 128).
enum class KvRead { kF16, kDecode, kStaged };

template <int KT>
__device__ __forceinline__ void fold_tile(const AttentionParams& p, int group, int hd, const __half* q_hi,
                                          const __half* q_lo, int64_t j0, int64_t begin, int64_t end,
                                          const __half* k_tile, const __half* v_tile, int lane, WarpState<KT>& st);

// The pool rows of a warp's tile at j0 (-1 where not in [begin, end)); f16 rows (kElement)
// as the element offset of the head in them.
template <bool kElement>
__device__ __forceinline__ void tile_rows(const Pages& kv, const int32_t* table, int64_t head_offset, int64_t j0,
                                          int64_t begin, int64_t end, int64_t* rows, int lane) {
  const int64_t j = j0 + lane;
  const bool visible = j >= begin && j < end;
  rows[lane] = !visible ? -1 : kElement ? kv.row(table, static_cast<int>(j)) * kv.ld + head_offset
                                        : kv.row(table, static_cast<int>(j));
  __syncwarp();
}

// One warp's 32-key tile at j0 (keys outside [begin, end) invisible) folded into its state:
// copy through the block table (kQuantized: decode the rows' codes, kv_rows.cuh), then fold_tile.
template <int KT, bool kQuantized>
__device__ __forceinline__ void attend_tile(const Pages& kv, const int32_t* table, int64_t head_offset, int hd,
                                            bool aligned, const AttentionParams& p, int group, const __half* q_hi,
                                            const __half* q_lo, int64_t j0, int64_t begin, int64_t end,
                                            __half* k_tile, __half* v_tile, int64_t* rows, int lane,
                                            WarpState<KT>& st) {
  const int stride = padded_row(hd);
  // Quantized rows: the pool row (read_tile finds the head in it); f16 rows: the element.
  tile_rows<!kQuantized>(kv, table, head_offset, j0, begin, end, rows, lane);
  if constexpr (kQuantized) {
    if (kv.pieces) {
      read_kv_pieces<KT>(kv, [rows](int key) { return rows[key]; }, kWarp, head_offset, hd, stride, lane, kWarp, k_tile,
                         v_tile);
    } else {
      read_tile(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, rows, kWarp, head_offset, hd, stride, k_tile, lane);
      read_tile(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, rows, kWarp, head_offset, hd, stride, v_tile, lane);
    }
  } else {
    copy_tile(kv.k, rows, hd, aligned, k_tile, lane);
    copy_tile(kv.v, rows, hd, aligned, v_tile, lane);
    copies_done();
  }
  __syncwarp();
  fold_tile<KT>(p, group, hd, q_hi, q_lo, j0, begin, end, k_tile, v_tile, lane, st);
}

// A warp's tile of 32 keys at j0, its f16 keys and values in shared memory, folded into the
// warp's state: S = Q·Kᵀ, the softmax update, O += P·V.
template <int KT>
__device__ __forceinline__ void fold_tile(const AttentionParams& p, int group, int hd, const __half* q_hi,
                                          const __half* q_lo, int64_t j0, int64_t begin, int64_t end,
                                          const __half* k_tile, const __half* v_tile, int lane, WarpState<KT>& st) {
  const int stride = padded_row(hd), steps = (hd + 15) / 16;
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

  // Softmax update per row: this lane holds rows lane/4 (s[j][0..1]) and lane/4 + 8
  // (s[j][2..3]) at keys 8j + 2(lane % 4) + {0, 1}; a row's 4 lanes reduce.
  float tile_max[2] = {-INFINITY, -INFINITY};
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
        tile_max[h] = fmaxf(tile_max[h], x);
      }
    }
  float m_new[2], correction[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    m_new[h] = fmaxf(st.m[h], tile_max[h]);
    correction[h] = m_new[h] == -INFINITY ? 1.0f : expf(st.m[h] - m_new[h]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[j][2 * h + e];
        x = seen[j][e] ? expf(x - m_new[h]) : 0.0f;
        row_sum[h] += x;
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    st.l[h] = st.l[h] * correction[h] + row_sum[h];
    st.m[h] = m_new[h];
  }
#pragma unroll
  for (int n = 0; n < 2 * KT; ++n) {
    st.o[n][0] *= correction[0];
    st.o[n][1] *= correction[0];
    st.o[n][2] *= correction[1];
    st.o[n][3] *= correction[1];
  }

  // O += P·V: the weights of 16 keys form an A fragment straight from two S tiles.
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
      mma(st.o[2 * dp], p_hi, b[0], b[1]);
      mma(st.o[2 * dp], p_lo, b[0], b[1]);
      mma(st.o[2 * dp + 1], p_hi, b[2], b[3]);
      mma(st.o[2 * dp + 1], p_lo, b[2], b[3]);
    }
  }
  __syncwarp();  // the tile is read: the next one may land
}

// One chunk's attention for heads [head0, head0 + group) of query t, keys [begin, end)
// (not empty) starting at chunk_begin: the block's result into the query's output
// (splits == 1) or the chunk's slot of partial (value, max, mass). Warp w takes keys
// chunk_begin + 128 i + 32 w for i = 0, 1, ... KT bounds the 16-dim steps of head_dim.
template <int KT, KvRead kRead>
__device__ __forceinline__ void attend_chunk(const float* __restrict__ q, int64_t ldq, const Pages& kv,
                                             const AttentionParams& p, int group, int splits, int64_t t, int split,
                                             int head0, int64_t chunk_begin, int64_t begin, int64_t end, float* out,
                                             int64_t ldo, float* partial) {
  extern __shared__ __align__(16) __half smem[];
  __shared__ float sm_m[kAttnWarps][kMmaRows], sm_l[kAttnWarps][kMmaRows];
  __shared__ int64_t sm_row[kAttnWarps][kRead == KvRead::kStaged ? 2 : 1][kWarp];  // staged: two tiles' rows
  const int kvh = head0 / (p.n_heads / p.n_kv_heads);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hd = p.head_dim, stride = padded_row(hd), steps = (hd + 15) / 16;
  __half* k_tile = smem + warp * kWarp * stride;
  __half* v_tile = smem + (kAttnWarps + warp) * kWarp * stride;
  __half* q_hi = smem + 2 * kChunk * stride;
  __half* q_lo = q_hi + (group + 1) * stride;
  const int32_t* table = kv.table(t);
  const int64_t head_offset = static_cast<int64_t>(kvh) * hd;

  grid_wait();  // the cache rows and q come from the previous kernel
  // Staged reads: the warp's first tile's copies go out before q is read.
  const KvStage key_stage(kv.key_codec, hd), value_stage(kv.value_codec, hd);
  uint8_t* k_stage = reinterpret_cast<uint8_t*>(smem) + block_bytes(hd, group) +
                     warp * (key_stage.bytes(kWarp) + value_stage.bytes(kWarp));
  uint8_t* v_stage = k_stage + key_stage.bytes(kWarp);
  int64_t j0 = chunk_begin + warp * kWarp;
  while (j0 < end && j0 + kWarp <= begin) j0 += kChunk;  // tiles wholly before the window
  // Affine rows of 8, 4 or 2 bits in heads of 128 (the common cases) staged and decoded with their shape known.
  const int affine_bits = kRead == KvRead::kStaged ? kv_staged_affine_h128_bits(kv.key_codec, kv.value_codec, hd) : 0;
  const auto stage_matrix = [&](const void* base, const KvRowCodec& c, int64_t row_bytes, const int64_t* rows,
                                uint8_t* staged) {
    if (affine_bits == 8)
      stage_tile_affine_h128<8>(base, c, row_bytes, kv.ld, rows, head_offset, staged, lane);
    else if (affine_bits == 4)
      stage_tile_affine_h128<4>(base, c, row_bytes, kv.ld, rows, head_offset, staged, lane);
    else if (affine_bits == 2)
      stage_tile_affine_h128<2>(base, c, row_bytes, kv.ld, rows, head_offset, staged, lane);
    else
      stage_tile(base, c, row_bytes, kv.ld, rows, kWarp, head_offset, hd, staged, lane);
  };
  const auto decode_matrix = [&](const KvRowCodec& c, const uint8_t* staged, const int64_t* rows, __half* tile) {
    if (affine_bits == 8)
      decode_staged_affine_h128<8>(c, staged, rows, stride, tile, lane);
    else if (affine_bits == 4)
      decode_staged_affine_h128<4>(c, staged, rows, stride, tile, lane);
    else if (affine_bits == 2)
      decode_staged_affine_h128<2>(c, staged, rows, stride, tile, lane);
    else
      decode_staged(c, staged, rows, kWarp, hd, stride, tile, lane);
  };
  const auto stage = [&](int64_t tile, int64_t* rows) {
    tile_rows<false>(kv, table, head_offset, tile, begin, end, rows, lane);
    stage_matrix(kv.k, kv.key_codec, kv.key_row_bytes, rows, k_stage);
    stage_matrix(kv.v, kv.value_codec, kv.value_row_bytes, rows, v_stage);
    copies_commit();
  };
  if constexpr (kRead == KvRead::kStaged)
    if (j0 < end) stage(j0, sm_row[warp][0]);
  // q (pre-scaled) as hi + lo f16 rows; row `group` stays zero.
  const int width = steps * 16;
  for (int i = threadIdx.x; i < (group + 1) * width; i += blockDim.x) {
    const int g = i / width, d = i % width;
    const float x = g < group && d < hd ? q[t * ldq + static_cast<int64_t>(head0 + g) * hd + d] * p.scale : 0.0f;
    const __half h = __float2half_rn(x);
    q_hi[g * stride + d] = h;
    q_lo[g * stride + d] = __float2half_rn(x - __half2float(h));
  }
  __syncthreads();

  WarpState<KT> st;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.0f;
#pragma unroll
  for (int n = 0; n < 2 * KT; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
  if constexpr (kRead == KvRead::kStaged) {
    // Tile i's staged bytes decoded into the f16 tiles, tile i + 1's copies issued, then
    // tile i's MMAs while they fly; the rows of the two tiles alternate between two buffers.
    for (int buffer = 0; j0 < end; j0 += kChunk, buffer ^= 1) {
      const int64_t* rows = sm_row[warp][buffer];
      copies_wait<0>();
      __syncwarp();
      decode_matrix(kv.key_codec, k_stage, rows, k_tile);
      decode_matrix(kv.value_codec, v_stage, rows, v_tile);
      __syncwarp();  // the staging area is free, the f16 tiles are whole
      if (j0 + kChunk < end) stage(j0 + kChunk, sm_row[warp][buffer ^ 1]);
      fold_tile<KT>(p, group, hd, q_hi, q_lo, j0, begin, end, k_tile, v_tile, lane, st);
    }
  } else {
    const bool aligned = (hd & 7) == 0 && (kv.ld & 7) == 0;
    for (; j0 < end; j0 += kChunk)
      attend_tile<KT, kRead == KvRead::kDecode>(kv, table, head_offset, hd, aligned, p, group, q_hi, q_lo, j0, begin,
                                                end, k_tile, v_tile, sm_row[warp][0], lane, st);
  }

  // The warps' states into shared memory (the tile area is free once every warp is here).
  __syncthreads();
  float* sm_acc = reinterpret_cast<float*>(smem);  // [warps][group][hd]
  const int r = lane / 4;
  if (lane % 4 == 0) {
    if (r < group) sm_m[warp][r] = st.m[0], sm_l[warp][r] = st.l[0];
    if (r + 8 < group) sm_m[warp][r + 8] = st.m[1], sm_l[warp][r + 8] = st.l[1];
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
        if (d < hd) sm_acc[(warp * group + row) * hd + d] = st.o[n][2 * h + e];
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
    if (splits == 1) {  // the merge's arithmetic for one chunk (weight 1 / sum): the same bits as in a longer step
      out[t * ldo + static_cast<int64_t>(head) * hd + d] = sum > 0.0f ? fmaf(value, 1.0f / sum, 0.0f) : 0.0f;
    } else {
      float* slot = partial + ((t * p.n_heads + head) * splits + split) * slot_floats(hd);
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
template <int KT, KvRead kRead>
__global__ void __launch_bounds__(kAttnWarps* kWarp, kRead == KvRead::kStaged ? 2 : 3)
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
  const int64_t chunk = chunk_keys(pos), chunk_begin = static_cast<int64_t>(split) * chunk;
  const int64_t first = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : int64_t{0};
  const int64_t begin = max(first, chunk_begin);
  const int64_t end = min(pos + 1, chunk_begin + chunk);
  if (begin < end) {
    attend_chunk<KT, kRead>(q, ldq, kv, p, group, splits, t, split, head0, chunk_begin, begin, end, out, ldo, partial);
  } else {
    grid_wait();
    for (int i = threadIdx.x; splits > 1 && i < group * slot_floats(hd); i += blockDim.x) {
      const int g = i / slot_floats(hd), d = i % slot_floats(hd);
      partial[((t * p.n_heads + head0 + g) * splits + split) * slot_floats(hd) + d] = d == hd ? -INFINITY : 0.0f;
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
  // Per head, the chunks' largest max and total mass (one warp per head, lanes over
  // chunks), and each chunk's weight exp(m - big) / total, kept in the tile area (no
  // longer read); then every output element is its chunks' values, weighted.
  extern __shared__ __align__(16) __half smem[];
  float* sm_w = reinterpret_cast<float*>(smem);  // [group][kMaxSplits]
  for (int g = warp; g < group; g += kAttnWarps) {
    const float* slots = partial + (t * p.n_heads + head0 + g) * splits * slot_floats(hd);
    float big = -INFINITY;
    for (int c = lane; c < splits; c += kWarp)
      if (__ldcg(slots + c * slot_floats(hd) + hd + 1) > 0.0f) big = fmaxf(big, __ldcg(slots + c * slot_floats(hd) + hd));
    big = warp_max(big);
    float sum = 0.0f;
    for (int c = lane; c < splits; c += kWarp) {
      const float l_c = __ldcg(slots + c * slot_floats(hd) + hd + 1);
      if (l_c > 0.0f) sum += l_c * expf(__ldcg(slots + c * slot_floats(hd) + hd) - big);
    }
    sum = warp_sum(sum);
    for (int c = lane; c < splits; c += kWarp)
      sm_w[g * kMaxSplits + c] = sum > 0.0f ? expf(__ldcg(slots + c * slot_floats(hd) + hd) - big) / sum : 0.0f;
  }
  __syncthreads();
  // Four dims per thread (slots are 16-byte aligned), many chunks' loads in flight: this
  // block's merge is the tail every other block of the step waits behind.
  const int slot = slot_floats(hd), quads = (hd + 3) / 4;
  for (int idx = threadIdx.x; idx < group * quads; idx += blockDim.x) {
    const int g = idx / quads, d = (idx % quads) * 4, head = head0 + g;
    const float* slots = partial + (t * p.n_heads + head) * splits * slot + d;
    float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
    for (int c = 0; c < splits; ++c) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(slots + c * slot));
      const float w = sm_w[g * kMaxSplits + c];
      value.x = fmaf(v.x, w, value.x);
      value.y = fmaf(v.y, w, value.y);
      value.z = fmaf(v.z, w, value.z);
      value.w = fmaf(v.w, w, value.w);
    }
    float* row = out + t * ldo + static_cast<int64_t>(head) * hd;
    const float values[4] = {value.x, value.y, value.z, value.w};
    for (int e = 0; e < 4 && d + e < hd; ++e) row[d + e] = values[e];
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

// Chunks per query for a step whose longest query has max_kv keys: a query of fewer than
// kChunk · kMaxSplits keys takes one chunk per 128 keys, a longer one kMaxSplits chunks.
int64_t splits_for(int64_t max_kv) {
  return std::clamp<int64_t>((max_kv + kChunk - 1) / kChunk, 1, kMaxSplits);
}

// grid (n, n_heads): a block turns one head's rotated output back (kv_unrotate) in shared
// memory, each stage's butterflies in parallel — every element sees the same operations in
// the same order as walsh_hadamard's loops, so the same bits — once the attention that wrote
// it is complete (grid_wait: launched as every kernel is, it may start while that still runs).
__global__ void unrotate_heads_kernel(float* out, int n_heads, int hd, int64_t ldo, int block) {
  extern __shared__ float v[];  // [hd]
  grid_wait();
  float* head = out + blockIdx.x * ldo + static_cast<int64_t>(blockIdx.y) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = head[i];
  __syncthreads();
  const int half = block / 2;
  for (int len = 1; len < block; len <<= 1) {
    for (int k = threadIdx.x; k < hd / 2; k += blockDim.x) {
      const int local = k % half, j = k / half * block + local / len * 2 * len + local % len;
      const float a = v[j], b = v[j + len];
      v[j] = a + b;
      v[j + len] = a - b;
    }
    __syncthreads();
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(block));
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    const float x = KETTLE_MUL(v[i], scale);
    head[i] = kv_rotation_flips(i) ? -x : x;
  }
}

}  // namespace

void unrotate_heads(float* out, int64_t n, int n_heads, int head_dim, int64_t ldo, int block, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(n_heads));
  const int threads = std::clamp(head_dim / 2, kWarp, 128);
  launch(unrotate_heads_kernel, grid, threads, static_cast<size_t>(head_dim) * sizeof(float), stream, out, n_heads,
         head_dim, ldo, block);
}

void allow_shared_memory(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::set<const void*> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!allowed.insert(kernel).second) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  // All of the unified L1 as shared memory: more blocks per SM.
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

int64_t attention_partial_floats(int64_t n, int64_t max_kv, const AttentionParams& p) {
  const int64_t splits = splits_for(max_kv);
  return splits > 1 ? n * p.n_heads * splits * slot_floats(p.head_dim) : 0;
}

void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
               const AttentionParams& p, float* out, int64_t ldo, float* partial, unsigned* arrivals,
               cudaStream_t stream) {
  if (n == 0) return;
  const int splits = static_cast<int>(splits_for(max_kv));
  const int group = heads_per_block(p);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.n_heads / group), static_cast<unsigned>(n));
  const Pages pages = pages_of(kv, p.head_dim);
  const bool codes = kv.codec.key.quantized() || kv.codec.value.quantized();
  const bool staged = codes && pages.pieces && kv_stages(kv.codec.key) && kv_stages(kv.codec.value) && p.head_dim <= 128;
  const size_t smem = block_bytes(p.head_dim, group) +
                      (staged ? kAttnWarps * static_cast<size_t>(KvStage(kv.codec.key, p.head_dim).bytes(kWarp) +
                                                                 KvStage(kv.codec.value, p.head_dim).bytes(kWarp))
                              : 0);
  const auto run = [&](auto kernel) {
    // Every kernel's most (staging adds at most 40 KB to heads ≤ 128, well under a head of 256's tiles).
    allow_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<int>(block_bytes(256, kMmaRows)));
    launch(kernel, grid, kAttnWarps * kWarp, smem, stream, q, ldq, pages, positions, p, group, splits, out, ldo, partial,
           arrivals);
  };
  // Quantized rows take kernels of their own (their decoding's registers stay out of the f16 ones).
  const KvRead read = !codes ? KvRead::kF16 : staged ? KvRead::kStaged : KvRead::kDecode;
  const auto pick = [read](auto f16, auto decode, auto staged_kernel) {
    return read == KvRead::kF16 ? f16 : read == KvRead::kDecode ? decode : staged_kernel;
  };
  if (p.head_dim <= 32)
    run(pick(attention_chunk_kernel<2, KvRead::kF16>, attention_chunk_kernel<2, KvRead::kDecode>,
             attention_chunk_kernel<2, KvRead::kStaged>));
  else if (p.head_dim <= 64)
    run(pick(attention_chunk_kernel<4, KvRead::kF16>, attention_chunk_kernel<4, KvRead::kDecode>,
             attention_chunk_kernel<4, KvRead::kStaged>));
  else if (p.head_dim <= 128)
    run(pick(attention_chunk_kernel<8, KvRead::kF16>, attention_chunk_kernel<8, KvRead::kDecode>,
             attention_chunk_kernel<8, KvRead::kStaged>));
  else
    run(pick(attention_chunk_kernel<16, KvRead::kF16>, attention_chunk_kernel<16, KvRead::kDecode>,
             attention_chunk_kernel<16, KvRead::kDecode>));
}

}  // namespace kettle::cuda
