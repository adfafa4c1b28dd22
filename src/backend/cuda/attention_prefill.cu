// Prompt attention (many queries of one sequence) on the tensor cores, tiled as
// FlashAttention-2 (Dao 2023): a block takes 64 or 128 consecutive queries of one
// head (one or two 16-row blocks per warp) and walks the keys in tiles of 64,
// double-buffered in shared memory by asynchronous copies through the block
// table; S = Q·Kᵀ and O = P·V
// are m16n8k16 f16 MMAs with f32 accumulators, the online softmax stays in f32
// registers. Q and P enter the MMAs as f16 (11 significant bits, the keys'
// and values' own precision in the cache). Causal by position (read from
// device memory), sliding window, Gemma-2 softcapping, GQA, head_dim ≤ 256.
//
// Batch invariance: key tiles sit at fixed multiples of 64 from key 0 and a
// query's row of each MMA depends on that row alone, so a query's sums run in
// the same order whatever chunk it arrives in; a tile holding none of a row's
// visible keys leaves that row's state unchanged bit for bit (max unchanged,
// correction exactly 1, zero weights), and a warp skips tiles none of its rows
// sees. Fast paths with the same bits: a tile all of a warp's rows see is not
// masked, and O is not rescaled while every row's max stays put.
#include <algorithm>
#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kPrefillWarps = 4;
constexpr int kKeyTile = 64;  // keys per shared-memory stage
constexpr int kMaxPrefillHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

// Queries per block: MR blocks of 16 rows (the MMA's M) per warp. Two for head_dim ≤ 128,
// so each K and V fragment read from shared memory feeds two MMAs; one for 256 (registers).
template <int MR>
__host__ __device__ constexpr int query_tile() {
  return kPrefillWarps * 16 * MR;
}

// Dynamic shared memory: the query tile, then two stages of key and value tiles.
size_t prefill_block_bytes(int hd, int query_rows) {
  return static_cast<size_t>(query_rows + 4 * kKeyTile) * padded_row(hd) * sizeof(__half);
}

// 2^x by the special-function unit alone: exp2f's extra steps only keep subnormal results,
// which the f16 weights and the row sums (≥ 1) never see.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Keys [k0, k0 + 64) of this head into a stage: rows outside [lo, hi] (before the block's
// first visible key, past its last: released or unwritten blocks) and dims past head_dim
// are zeros. 16-byte asynchronous copies when rows are aligned, else element by element.
template <int KT, bool kQuantized>
__device__ __forceinline__ void load_kv_tile(const Pages& kv, const int32_t* table, int64_t head_offset, int hd,
                                             bool aligned, int k0, int lo, int hi, __half* k_tile, __half* v_tile) {
  const int stride = padded_row(hd), width = (hd + 15) / 16 * 16;
  if (kQuantized && kv.pieces) {  // rows decoded into f16 as they land (kv_rows.cuh), 16 elements a load
    const auto row_of = [&](int key) {
      const int j = k0 + key;
      return j >= lo && j <= hi ? kv.row(table, j) : int64_t{-1};
    };
    read_kv_pieces<(KT * kKeyTile + kPrefillWarps * kWarp - 1) / (kPrefillWarps * kWarp)>(
        kv, row_of, kKeyTile, head_offset, hd, stride, threadIdx.x, kPrefillWarps * kWarp, k_tile, v_tile);
    return;
  }
  if (kQuantized) {  // 8 elements at a time where pieces do not fit
    const int pieces = width / 8;
    for (int i = threadIdx.x; i < kKeyTile * pieces; i += blockDim.x) {
      const int key = i / pieces, part = i % pieces, j = k0 + key;
      __half* dk = k_tile + key * stride + part * 8;
      __half* dv = v_tile + key * stride + part * 8;
      if (j >= lo && j <= hi && part * 8 < hd) {
        const int64_t row = kv.row(table, j), first = head_offset + part * 8;
        read_piece8(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, row, first, dk);
        read_piece8(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, row, first, dv);
      } else {
        *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
  if (aligned) {
    const int pieces = width / 8, real = hd / 8;
    for (int i = threadIdx.x; i < kKeyTile * pieces; i += blockDim.x) {
      const int key = i / pieces, part = i % pieces, j = k0 + key;
      __half* dk = k_tile + key * stride + part * 8;
      __half* dv = v_tile + key * stride + part * 8;
      if (j >= lo && j <= hi && part < real) {
        const int64_t row = kv.row(table, j) * kv.ld + head_offset + part * 8;
        copy16_async(dk, kv.k + row);
        copy16_async(dv, kv.v + row);
      } else {
        *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < kKeyTile * width; i += blockDim.x) {
    const int key = i / width, d = i % width, j = k0 + key;
    const bool real = j >= lo && j <= hi && d < hd;
    const int64_t row = real ? kv.row(table, j) * kv.ld + head_offset + d : 0;
    k_tile[key * stride + d] = real ? kv.k[row] : __float2half(0.0f);
    v_tile[key * stride + d] = real ? kv.v[row] : __float2half(0.0f);
  }
}

// The online-softmax state of a warp's MR × 16 query rows: of row block r this lane holds
// rows lane/4 (h = 0) and lane/4 + 8 (h = 1), and of O the dims 8n + 2(lane % 4) + {0, 1}.
template <int KT, int MR>
struct RowState {
  float o[MR][2 * KT][4];
  float m[MR][2], l[MR][2];
  int pos[MR][2], first[MR][2];  // a row's visible keys: [first, pos]; pos -1 for rows past n
};

// One key tile [k0, k0 + 64) for this warp's rows: scores, masking, the softmax update and
// P·V. q_rows: the warp's MR × 16 query rows in shared memory. FULL: every row of the warp
// sees every key of the tile, so nothing is masked (the same bits as masking nothing).
template <int KT, int MR, bool FULL>
__device__ __forceinline__ void attend_tile(const __half* q_rows, const __half* k_tile, const __half* v_tile, int hd,
                                            const AttentionParams& p, int k0, int lane, RowState<KT, MR>& st) {
  const int stride = padded_row(hd), steps = (hd + 15) / 16;
  float s[MR][kKeyTile / 8][4];
#pragma unroll
  for (int r = 0; r < MR; ++r)
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) s[r][j][0] = s[r][j][1] = s[r][j][2] = s[r][j][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    if (ks >= steps) break;
    uint32_t a[MR][4];
#pragma unroll
    for (int r = 0; r < MR; ++r)
      load_matrices(a[r], q_rows + (r * 16 + lane % 16) * stride + ks * 16 + (lane / 16) * 8);
#pragma unroll
    for (int pair = 0; pair < kKeyTile / 16; ++pair) {
      uint32_t b[4];  // keys 16 pair + [0, 8) and + [8, 16), dims 16 ks + [0, 8) and + [8, 16)
      load_matrices(b, k_tile + (pair * 16 + lane % 8 + (lane / 16) * 8) * stride + ks * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        mma(s[r][2 * pair], a[r], b[0], b[1]);
        mma(s[r][2 * pair + 1], a[r], b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < MR; ++r) {
    // Mask and the tile's max per row (a row's 4 lanes reduce).
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + j * 8 + (lane % 4) * 2 + e;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = s[r][j][2 * h + e];
          if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
          if (!FULL) x = key >= st.first[r][h] && key <= st.pos[r][h] ? x : -INFINITY;
          tile_max[h] = fmaxf(tile_max[h], x);
        }
      }
    float correction[2], row_sum[2] = {0.0f, 0.0f}, m_new[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      m_new[h] = fmaxf(st.m[r][h], tile_max[h]);
      correction[h] = m_new[h] == -INFINITY ? 1.0f : exp2_fast((st.m[r][h] - m_new[h]) * kLog2e);
    }
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = s[r][j][2 * h + e];
          x = !FULL && x == -INFINITY ? 0.0f : exp2_fast((x - m_new[h]) * kLog2e);
          row_sum[h] += x;
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
      row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
      st.l[r][h] = st.l[r][h] * correction[h] + row_sum[h];
      st.m[r][h] = m_new[h];
    }
    // Once a row's max settles, its correction is exactly 1 tile after tile: no rescale.
    if (!__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) continue;
#pragma unroll
    for (int n = 0; n < 2 * KT; ++n) {
      st.o[r][n][0] *= correction[0];
      st.o[r][n][1] *= correction[0];
      st.o[r][n][2] *= correction[1];
      st.o[r][n][3] *= correction[1];
    }
  }
  // O += P·V: the weights of 16 keys form an A fragment straight from two S tiles.
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk) {
    uint32_t a[MR][4];
#pragma unroll
    for (int r = 0; r < MR; ++r) {
      a[r][0] = pack_half2(s[r][2 * kk][0], s[r][2 * kk][1]);
      a[r][1] = pack_half2(s[r][2 * kk][2], s[r][2 * kk][3]);
      a[r][2] = pack_half2(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
      a[r][3] = pack_half2(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < KT; ++dp) {
      if (dp >= steps) break;
      uint32_t b[4];  // keys 16 kk + [0, 8) and + [8, 16), dims 16 dp + [0, 8) and + [8, 16)
      load_matrices<true>(b, v_tile + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * stride + dp * 16 + (lane / 16) * 8);
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        mma(st.o[r][2 * dp], a[r], b[0], b[1]);
        mma(st.o[r][2 * dp + 1], a[r], b[2], b[3]);
      }
    }
  }
}

// KT: 16-dim steps of head_dim (≤ 16 KT); MR: row blocks per warp; kQuantized: the rows are codes
// (kernels of their own: their decoding's registers stay out of the f16 ones).
template <int KT, int MR, bool kQuantized>
__global__ void __launch_bounds__(kPrefillWarps* kWarp)
    attention_prefill_kernel(const float* __restrict__ q, int64_t n, int64_t ldq, Pages kv,
                             const int32_t* __restrict__ positions, AttentionParams p, float* out, int64_t ldo) {
  constexpr int kQueryTile = query_tile<MR>(), kWarpRows = 16 * MR;
  extern __shared__ __align__(16) __half smem[];
  __shared__ int block_range[2];
  __shared__ int warp_ranges[kPrefillWarps][2];
  const int hd = p.head_dim, stride = padded_row(hd), width = (hd + 15) / 16 * 16;
  const int head = blockIdx.y, kvh = head / (p.n_heads / p.n_kv_heads);
  // The last query tiles see the most keys: they start first.
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kQueryTile;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __half* q_tile = smem;
  __half* k_tiles = q_tile + kQueryTile * stride;      // [2][kKeyTile][stride]
  __half* v_tiles = k_tiles + 2 * kKeyTile * stride;  // [2][kKeyTile][stride]

  // Positions are the step's inputs (uploaded before its first kernel): read before the wait.
  RowState<KT, MR> st;
  int warp_lo = INT_MAX, warp_hi = -1;
  int full_lo = -1, full_hi = INT_MAX;  // keys every row of the warp sees: [full_lo, full_hi]
#pragma unroll
  for (int r = 0; r < MR; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + warp * kWarpRows + r * 16 + lane / 4 + 8 * h;
      st.pos[r][h] = t < n ? positions[t] : -1;
      st.first[r][h] = p.sliding_window > 0 ? max(0, st.pos[r][h] - p.sliding_window + 1) : 0;
      st.m[r][h] = -INFINITY;
      st.l[r][h] = 0.0f;
      if (st.pos[r][h] >= 0) warp_lo = min(warp_lo, st.first[r][h]), warp_hi = max(warp_hi, st.pos[r][h]);
      full_lo = max(full_lo, st.first[r][h]);
      full_hi = min(full_hi, st.pos[r][h]);  // a row past n (-1) leaves no tile full
#pragma unroll
      for (int nn = 0; nn < 2 * KT; ++nn) st.o[r][nn][2 * h] = st.o[r][nn][2 * h + 1] = 0.0f;
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    warp_lo = min(warp_lo, __shfl_xor_sync(0xffffffffu, warp_lo, o));
    warp_hi = max(warp_hi, __shfl_xor_sync(0xffffffffu, warp_hi, o));
    full_lo = max(full_lo, __shfl_xor_sync(0xffffffffu, full_lo, o));
    full_hi = min(full_hi, __shfl_xor_sync(0xffffffffu, full_hi, o));
  }
  if (lane == 0) warp_ranges[warp][0] = warp_lo, warp_ranges[warp][1] = warp_hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    int lo = INT_MAX, hi = -1;
    for (int w = 0; w < kPrefillWarps; ++w) lo = min(lo, warp_ranges[w][0]), hi = max(hi, warp_ranges[w][1]);
    block_range[0] = lo;
    block_range[1] = hi;
  }
  __syncthreads();
  const int lo = block_range[0], hi = block_range[1];

  grid_wait();  // q and the cache rows come from the previous kernel
  const int32_t* table = kv.table(0);
  const int64_t head_offset = static_cast<int64_t>(kvh) * hd;
  const bool aligned = (hd & 7) == 0 && (kv.ld & 7) == 0;
  const int first_tile = lo / kKeyTile, last_tile = hi / kKeyTile;
  const int stage_halves = kKeyTile * stride;
  load_kv_tile<KT, kQuantized>(kv, table, head_offset, hd, aligned, first_tile * kKeyTile, lo, hi, k_tiles, v_tiles);
  copies_commit();
  // Q (pre-scaled) as f16 rows while the first tile flies; rows past n and dims past hd zero.
  for (int i = threadIdx.x; i < kQueryTile * width; i += blockDim.x) {
    const int r = i / width, d = i % width;
    const int64_t t = t0 + r;
    const float x = t < n && d < hd ? q[t * ldq + static_cast<int64_t>(head) * hd + d] * p.scale : 0.0f;
    q_tile[r * stride + d] = __float2half_rn(x);
  }
  for (int tile = first_tile; tile <= last_tile; ++tile) {
    const int stage = (tile - first_tile) & 1;
    if (tile < last_tile) {
      const int next = stage ^ 1;
      load_kv_tile<KT, kQuantized>(kv, table, head_offset, hd, aligned, (tile + 1) * kKeyTile, lo, hi, k_tiles + next * stage_halves,
                   v_tiles + next * stage_halves);
      copies_commit();
      copies_wait<1>();
    } else {
      copies_wait<0>();
    }
    __syncthreads();
    const int k0 = tile * kKeyTile;
    const __half* q_rows = q_tile + warp * kWarpRows * stride;
    if (k0 >= full_lo && k0 + kKeyTile - 1 <= full_hi)
      attend_tile<KT, MR, true>(q_rows, k_tiles + stage * stage_halves, v_tiles + stage * stage_halves, hd, p, k0,
                                lane, st);
    else if (k0 <= warp_hi && k0 + kKeyTile - 1 >= warp_lo)
      attend_tile<KT, MR, false>(q_rows, k_tiles + stage * stage_halves, v_tiles + stage * stage_halves, hd, p, k0,
                                 lane, st);
    __syncthreads();  // the stage is free for the tile after next
  }
#pragma unroll
  for (int r = 0; r < MR; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + warp * kWarpRows + r * 16 + lane / 4 + 8 * h;
      if (t >= n) continue;
      float* row = out + t * ldo + static_cast<int64_t>(head) * hd;
#pragma unroll
      for (int nn = 0; nn < 2 * KT; ++nn)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = nn * 8 + (lane % 4) * 2 + e;
          if (d < hd) row[d] = st.l[r][h] > 0.0f ? st.o[r][nn][2 * h + e] / st.l[r][h] : 0.0f;
        }
    }
}

// The kernel for f16 rows or for quantized ones.
template <int KT, int MR>
auto prefill_kernel(bool quantized) {
  return quantized ? attention_prefill_kernel<KT, MR, true> : attention_prefill_kernel<KT, MR, false>;
}

}  // namespace

bool attention_prefill_supported(const AttentionParams& p, const KvPages& kv) {
  return p.head_dim <= kMaxPrefillHeadDim && kv.table_stride == 0;
}

void attention_prefill(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                       const AttentionParams& p, float* out, int64_t ldo, cudaStream_t stream) {
  if (n == 0) return;
  const Pages pages = pages_of(kv, p.head_dim);
  const auto run = [&](auto kernel, int max_head_dim, int query_rows) {
    allow_shared_memory(reinterpret_cast<const void*>(kernel),
                        static_cast<int>(prefill_block_bytes(max_head_dim, query_rows)));
    const dim3 grid(blocks_for(n, query_rows), static_cast<unsigned>(p.n_heads));
    launch(kernel, grid, kPrefillWarps * kWarp, prefill_block_bytes(p.head_dim, query_rows), stream, q, n, ldq, pages,
           positions, p, out, ldo);
  };
  // Two row blocks per warp while the grid still fills the device twice over, else one
  // (a short chunk over a long cache): a row's sums are the same either way, since they
  // depend only on the key tiles, which sit at fixed positions.
  static const int sms = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return std::max(count, 1);
  }();
  const bool wide = static_cast<int64_t>(blocks_for(n, query_tile<2>())) * p.n_heads >= 2 * sms;
  const bool codes = kv.codec.key.quantized() || kv.codec.value.quantized();
  if (p.head_dim <= 32)
    wide ? run(prefill_kernel<2, 2>(codes), 32, query_tile<2>()) : run(prefill_kernel<2, 1>(codes), 32, query_tile<1>());
  else if (p.head_dim <= 64)
    wide ? run(prefill_kernel<4, 2>(codes), 64, query_tile<2>()) : run(prefill_kernel<4, 1>(codes), 64, query_tile<1>());
  else if (p.head_dim <= 128)
    wide ? run(prefill_kernel<8, 2>(codes), 128, query_tile<2>())
         : run(prefill_kernel<8, 1>(codes), 128, query_tile<1>());
  else
    run(prefill_kernel<16, 1>(codes), kMaxPrefillHeadDim, query_tile<1>());
}

}  // namespace kettle::cuda
