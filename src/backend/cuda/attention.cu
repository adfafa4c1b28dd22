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

// Fragment-decode blocks per SM the compiler budgets registers for: at 3, 168 registers and no spills;
// at 4, 128 with ~200 bytes spilled, and the kernel ran 121 µs against 84 µs (ncu, H200, 8-bit, depth 32k).
constexpr int kFragmentBlocksPerSm = 3;

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
// rows decoded as they are loaded (kv_rows.cuh, every codec); quantized rows staged —
// their raw bytes copied asynchronously, the next tile's in flight while this one's MMAs run,
// then decoded from shared memory (kv_stages codecs, heads up to 128); or, for heads of 128 in
// one codec, affine of 8, 4 or 2 bits or fp8 (kv_fragment_codec), staged and decoded from shared memory
// straight into the MMAs' fragments (no f16 tiles: a third of the shared memory, twice the
// blocks per SM).
enum class KvRead { kF16, kDecode, kStaged, kFragments8, kFragments4, kFragments2, kFragmentsFp8 };

// A fragment read's bits a code (0: not a fragment read), and whether its codes are fp8.
__host__ __device__ constexpr int fragment_bits(KvRead read) {
  return read == KvRead::kFragments8 || read == KvRead::kFragmentsFp8 ? 8
         : read == KvRead::kFragments4                               ? 4
         : read == KvRead::kFragments2                               ? 2
                                                                     : 0;
}
__host__ __device__ constexpr bool fragment_fp8(KvRead read) { return read == KvRead::kFragmentsFp8; }

// Fragment reads permute a head's dims (the same way for q and k, so the scores are the same
// sums): the keys' MMA step ks takes dims 32 (k % 8) / 2 + 4 ks + 2 (k / 8) + k % 2 for its
// k-th element (k < 16), so a lane's B fragments of a key are 32 consecutive dims; the values'
// n-tile n holds dims 16 c + n for its column c, so a lane's are 16 consecutive dims of a key.
__device__ __forceinline__ int fragment_key_dim(int logical) {
  const int ks = logical / 16, k = logical % 16;
  return 32 * ((k % 8) / 2) + 4 * ks + 2 * (k / 8) + k % 2;
}

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

// S = Q·Kᵀ from a warp's f16 key tile: 16 head rows × the tile's 32 keys as four 8-key MMA tiles.
template <int KT>
__device__ __forceinline__ void tile_scores(int group, int hd, const __half* q_hi, const __half* q_lo,
                                            const __half* k_tile, int lane, float (&s)[4][4]) {
  const int stride = padded_row(hd), steps = (hd + 15) / 16;
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
}

// A tile's scores s (keys j0 + [0, 32); outside [begin, end): weight 0) folded into the warp's
// online softmax: s becomes the tile's weights, the state's O rescaled to the new max.
template <int KT>
__device__ __forceinline__ void softmax_update(const AttentionParams& p, int64_t j0, int64_t begin, int64_t end,
                                               int lane, float (&s)[4][4], WarpState<KT>& st) {
  // Per row: this lane holds rows lane/4 (s[j][0..1]) and lane/4 + 8 (s[j][2..3]) at keys
  // 8j + 2(lane % 4) + {0, 1}; a row's 4 lanes reduce.
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
}

// The weights of keys 16 kk + [0, 16) as the A fragments of O += P·V, straight from two S
// tiles, split into f16 hi and lo halves.
__device__ __forceinline__ void weight_fragments(const float (&s)[4][4], int kk, uint32_t (&p_hi)[4],
                                                 uint32_t (&p_lo)[4]) {
  split_pair(s[2 * kk][0], s[2 * kk][1], p_hi[0], p_lo[0]);
  split_pair(s[2 * kk][2], s[2 * kk][3], p_hi[1], p_lo[1]);
  split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], p_hi[2], p_lo[2]);
  split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], p_hi[3], p_lo[3]);
}

// O += P·V from a warp's f16 value tile.
template <int KT>
__device__ __forceinline__ void tile_values(int hd, const float (&s)[4][4], const __half* v_tile, int lane,
                                            WarpState<KT>& st) {
  const int stride = padded_row(hd), steps = (hd + 15) / 16;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t p_hi[4], p_lo[4];
    weight_fragments(s, kk, p_hi, p_lo);
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
}

// A warp's tile of 32 keys at j0, its f16 keys and values in shared memory, folded into the
// warp's state: S = Q·Kᵀ, the softmax update, O += P·V.
template <int KT>
__device__ __forceinline__ void fold_tile(const AttentionParams& p, int group, int hd, const __half* q_hi,
                                          const __half* q_lo, int64_t j0, int64_t begin, int64_t end,
                                          const __half* k_tile, const __half* v_tile, int lane, WarpState<KT>& st) {
  float s[4][4];
  tile_scores<KT>(group, hd, q_hi, q_lo, k_tile, lane, s);
  softmax_update<KT>(p, j0, begin, end, lane, s, st);
  tile_values<KT>(hd, s, v_tile, lane, st);
  __syncwarp();  // the tile is read: the next one may land
}

// S = Q·Kᵀ from a staged tile of keys (fragment reads, heads of 128): a lane decodes, for
// each of its keys 8j + lane/4, the 32 dims 32 (lane % 4) + [0, 32) — per half of them one
// load of codes and one parameter block — into the B fragments of the 8 MMA steps, q's rows
// permuted to match (fragment_key_dim).
template <int B, bool kFp8>
__device__ __forceinline__ void fragment_scores(int group, int code_group, const __half* q_hi, const __half* q_lo,
                                                const uint8_t* k_stage, int lane, float (&s)[4][4]) {
  constexpr int kRow = kv_fragment_row(B), kWords = B / 2;
  const int stride = padded_row(128), r = lane / 4, t = lane % 4, groups = 128 / code_group;
  const uint8_t* params = k_stage + 32 * kRow;
#pragma unroll
  for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  const int q_row = min(lane % 16, group);  // rows past G read the zero row
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t codes[4][kWords];
    float scale[4], bias[4];
    const int g = (32 * t + 16 * half) / code_group;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      load_code_words<B>(k_stage + (8 * j + r) * kRow + 4 * B * t + 2 * B * half, codes[j]);
      load_code_params<kFp8>(params, groups, 8 * j + r, g, scale[j], bias[j]);
    }
#pragma unroll
    for (int q4 = 0; q4 < 4; ++q4) {
      const int ks = 4 * half + q4;
      uint32_t a_hi[4], a_lo[4];
      load_matrices(a_hi, q_hi + q_row * stride + ks * 16 + (lane / 16) * 8);
      load_matrices(a_lo, q_lo + q_row * stride + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b0 = pack_half2(code_value<B, kFp8>(codes[j], 4 * q4, scale[j], bias[j]),
                                       code_value<B, kFp8>(codes[j], 4 * q4 + 1, scale[j], bias[j]));
        const uint32_t b1 = pack_half2(code_value<B, kFp8>(codes[j], 4 * q4 + 2, scale[j], bias[j]),
                                       code_value<B, kFp8>(codes[j], 4 * q4 + 3, scale[j], bias[j]));
        mma(s[j], a_hi, b0, b1);
        mma(s[j], a_lo, b0, b1);
      }
    }
  }
}

// O += P·V from a staged tile of values (fragment reads): for its four keys of each 16,
// 16 kk + 2 (lane % 4) + {0, 1, 8, 9}, a lane decodes dims 16 (lane / 4) + [0, 16) — one
// load of codes and one parameter block a key — into the B fragments of the 16 n-tiles
// (n-tile n, column c: dim 16 c + n).
template <int B, bool kFp8>
__device__ __forceinline__ void fragment_values(int code_group, const float (&s)[4][4], const uint8_t* v_stage,
                                                int lane, WarpState<8>& st) {
  constexpr int kRow = kv_fragment_row(B), kWords = B / 2;
  const int r = lane / 4, t = lane % 4, groups = 128 / code_group, g = 16 * r / code_group;
  const uint8_t* params = v_stage + 32 * kRow;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    uint32_t p_hi[4], p_lo[4];
    weight_fragments(s, kk, p_hi, p_lo);
    uint32_t codes[4][kWords];
    float scale[4], bias[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = 16 * kk + 2 * t + (c & 1) + 8 * (c >> 1);
      load_code_words<B>(v_stage + key * kRow + 2 * B * r, codes[c]);
      load_code_params<kFp8>(params, groups, key, g, scale[c], bias[c]);
    }
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      const uint32_t b0 = pack_half2(code_value<B, kFp8>(codes[0], n, scale[0], bias[0]),
                                     code_value<B, kFp8>(codes[1], n, scale[1], bias[1]));
      const uint32_t b1 = pack_half2(code_value<B, kFp8>(codes[2], n, scale[2], bias[2]),
                                     code_value<B, kFp8>(codes[3], n, scale[3], bias[3]));
      mma(st.o[n], p_hi, b0, b1);
      mma(st.o[n], p_lo, b0, b1);
    }
  }
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

// The fragment reads' walk of a warp's tiles from j0 (keys [begin, end)) into st: one staging
// area a matrix, the next tile's keys copied while this tile's softmax and values run, its
// values while the next tile's scores run (two commit groups a tile, keys then values).
template <int B, bool kFp8>
__device__ __forceinline__ void walk_fragment_tiles(const Pages& kv, const AttentionParams& p, const int32_t* table,
                                                    int64_t head_offset, int group, const __half* q_hi,
                                                    const __half* q_lo, int64_t j0, int64_t begin, int64_t end,
                                                    int64_t* rows, uint8_t* k_stage, uint8_t* v_stage, int lane,
                                                    WarpState<8>& st) {
  const int code_group = kv.key_codec.group;
  for (; j0 < end; j0 += kChunk) {
    copies_wait<1>();  // this tile's keys (its values may still fly)
    __syncwarp();
    float s[4][4];
    fragment_scores<B, kFp8>(group, code_group, q_hi, q_lo, k_stage, lane, s);
    __syncwarp();  // the keys are read: the next tile's may land
    const int64_t next = j0 + kChunk;
    if (next < end) {
      tile_rows<false>(kv, table, head_offset, next, begin, end, rows, lane);
      stage_fragment_tile<B>(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, rows, head_offset, k_stage, lane);
    }
    copies_commit();
    softmax_update<8>(p, j0, begin, end, lane, s, st);
    copies_wait<1>();  // this tile's values
    __syncwarp();
    fragment_values<B, kFp8>(code_group, s, v_stage, lane, st);
    __syncwarp();  // the values are read
    if (next < end)
      stage_fragment_tile<B>(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, rows, head_offset, v_stage, lane);
    copies_commit();
  }
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
  constexpr int kBits = fragment_bits(kRead);
  extern __shared__ __align__(16) __half smem[];
  __shared__ float sm_m[kAttnWarps][kMmaRows], sm_l[kAttnWarps][kMmaRows];
  __shared__ int64_t sm_row[kAttnWarps][kRead == KvRead::kStaged ? 2 : 1][kWarp];  // staged: two tiles' rows
  const int kvh = head0 / (p.n_heads / p.n_kv_heads);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int hd = p.head_dim, stride = padded_row(hd), steps = (hd + 15) / 16;
  // Fragment reads: q, then each warp's staging areas. Otherwise: the warps' f16 K and V
  // tiles, q, then (staged) each warp's staging areas.
  __half* k_tile = smem + warp * kWarp * stride;
  __half* v_tile = smem + (kAttnWarps + warp) * kWarp * stride;
  __half* q_hi = kBits > 0 ? smem : smem + 2 * kChunk * stride;
  __half* q_lo = q_hi + (group + 1) * stride;
  const int32_t* table = kv.table(t);
  const int64_t head_offset = static_cast<int64_t>(kvh) * hd;

  grid_wait();  // the cache rows and q come from the previous kernel
  // Staged reads: the warp's first tile's copies go out before q is read.
  uint8_t* k_stage;
  uint8_t* v_stage;
  if constexpr (kBits > 0) {
    const int matrix = kv_fragment_stage_bytes(kBits, kv.key_codec.group);
    k_stage = reinterpret_cast<uint8_t*>(q_lo + (group + 1) * stride) + warp * 2 * matrix;
    v_stage = k_stage + matrix;
  } else {
    const KvStage key_stage(kv.key_codec, hd), value_stage(kv.value_codec, hd);
    k_stage = reinterpret_cast<uint8_t*>(smem) + block_bytes(hd, group) +
              warp * (key_stage.bytes(kWarp) + value_stage.bytes(kWarp));
    v_stage = k_stage + key_stage.bytes(kWarp);
  }
  int64_t j0 = chunk_begin + warp * kWarp;
  while (j0 < end && j0 + kWarp <= begin) j0 += kChunk;  // tiles wholly before the window
  const auto stage = [&](int64_t tile, int64_t* rows) {
    tile_rows<false>(kv, table, head_offset, tile, begin, end, rows, lane);
    if constexpr (kBits > 0) {  // keys and values in groups of their own
      stage_fragment_tile<kBits>(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, rows, head_offset, k_stage, lane);
      copies_commit();
      stage_fragment_tile<kBits>(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, rows, head_offset, v_stage, lane);
    } else {
      stage_tile(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, rows, kWarp, head_offset, hd, k_stage, lane);
      stage_tile(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, rows, kWarp, head_offset, hd, v_stage, lane);
    }
    copies_commit();
  };
  if constexpr (kRead == KvRead::kStaged || kBits > 0)
    if (j0 < end) stage(j0, sm_row[warp][0]);
  // q (pre-scaled) as hi + lo f16 rows; row `group` stays zero. Fragment reads: element d of
  // a row is dim fragment_key_dim(d).
  const int width = steps * 16;
  for (int i = threadIdx.x; i < (group + 1) * width; i += blockDim.x) {
    const int g = i / width, d = i % width, dim = kBits > 0 ? fragment_key_dim(d) : d;
    const float x = g < group && d < hd ? q[t * ldq + static_cast<int64_t>(head0 + g) * hd + dim] * p.scale : 0.0f;
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
  if constexpr (kBits > 0) {
    if (j0 < end)
      walk_fragment_tiles<kBits, fragment_fp8(kRead)>(kv, p, table, head_offset, group, q_hi, q_lo, j0, begin, end, sm_row[warp][0], k_stage,
                                 v_stage, lane, st);
  } else if constexpr (kRead == KvRead::kStaged) {
    // Tile i's staged bytes decoded into the f16 tiles, tile i + 1's copies issued, then
    // tile i's MMAs while they fly; the rows of the two tiles alternate between two buffers.
    for (int buffer = 0; j0 < end; j0 += kChunk, buffer ^= 1) {
      const int64_t* rows = sm_row[warp][buffer];
      copies_wait<0>();
      __syncwarp();
      decode_staged(kv.key_codec, k_stage, rows, kWarp, hd, stride, k_tile, lane);
      decode_staged(kv.value_codec, v_stage, rows, kWarp, hd, stride, v_tile, lane);
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
        const int column = (lane % 4) * 2 + e, d = kBits > 0 ? 16 * column + n : n * 8 + column;
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
__global__ void __launch_bounds__(kAttnWarps* kWarp, kRead == KvRead::kStaged ? 2 : fragment_bits(kRead) > 0 ? kFragmentBlocksPerSm : 3)
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
  const FragmentCodec fragment =
      codes && pages.pieces ? kv_fragment_codec(kv.codec.key, kv.codec.value, p.head_dim) : FragmentCodec::kNone;
  const bool fragments = fragment != FragmentCodec::kNone;
  const bool staged = codes && !fragments && pages.pieces && kv_stages(kv.codec.key) && kv_stages(kv.codec.value) &&
                      p.head_dim <= 128;
  size_t smem = block_bytes(p.head_dim, group);
  if (staged)
    smem += kAttnWarps * static_cast<size_t>(KvStage(kv.codec.key, p.head_dim).bytes(kWarp) +
                                             KvStage(kv.codec.value, p.head_dim).bytes(kWarp));
  if (fragments) {  // q and the staging areas; the merge's floats after the walk (warps · group · hd, group · splits)
    const size_t walk = 2 * static_cast<size_t>(group + 1) * padded_row(p.head_dim) * sizeof(__half) +
                        kAttnWarps * 2 * static_cast<size_t>(kv_fragment_stage_bytes(kv.codec.key.bits, kv.codec.key.group));
    const size_t merge = sizeof(float) * static_cast<size_t>(group) * (kAttnWarps * p.head_dim + kMaxSplits);
    smem = std::max(walk, merge);
  }
  const auto run = [&](auto kernel) {
    // Every kernel's most (staging adds at most 40 KB to heads ≤ 128, well under a head of 256's tiles).
    allow_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<int>(block_bytes(256, kMmaRows)));
    launch(kernel, grid, kAttnWarps * kWarp, smem, stream, q, ldq, pages, positions, p, group, splits, out, ldo, partial,
           arrivals);
  };
  // Quantized rows take kernels of their own (their decoding's registers stay out of the f16 ones).
  switch (fragment) {
    case FragmentCodec::kAffine8: return run(attention_chunk_kernel<8, KvRead::kFragments8>);
    case FragmentCodec::kAffine4: return run(attention_chunk_kernel<8, KvRead::kFragments4>);
    case FragmentCodec::kAffine2: return run(attention_chunk_kernel<8, KvRead::kFragments2>);
    case FragmentCodec::kFp8: return run(attention_chunk_kernel<8, KvRead::kFragmentsFp8>);
    case FragmentCodec::kNone: break;
  }
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
