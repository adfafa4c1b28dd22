// Prefill attention (many queries): a block takes 16 consecutive queries of
// one head and walks the keys in tiles of 32 held in shared memory; a lane
// owns one key of the tile for the scores (no shuffles per key) and head
// dims for P·V; online softmax per query, as in FlashAttention (Dao et al.
// 2022) but on f32 CUDA cores. Causal by position (read from device
// memory), sliding window, Gemma-2 softcapping. head_dim ≤ 128. All queries
// belong to one sequence: each tile's pool rows come from the one block table.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kQueryTile = 16;  // queries per block
constexpr int kTile = 32;       // keys per shared-memory tile (one per lane)
constexpr int kPrefillWarps = 4;
constexpr int kQueriesPerWarp = kQueryTile / kPrefillWarps;
constexpr int kMaxPrefillHeadDim = 128;

template <int D>  // head dims per lane (head_dim ≤ 32 D)
__global__ void __launch_bounds__(kPrefillWarps* kWarp)
    attention_prefill_kernel(const float* __restrict__ q, int64_t n, int64_t ldq, Pages kv,
                             const int32_t* __restrict__ positions, AttentionParams p, float* out, int64_t ldo) {
  grid_wait();
  __shared__ float qs[kQueryTile][kMaxPrefillHeadDim];
  __shared__ float ks[kTile][kMaxPrefillHeadDim + 1];  // +1: lanes read a column, not one bank
  __shared__ float vs[kTile][kMaxPrefillHeadDim];
  __shared__ float ps[kPrefillWarps][kQueriesPerWarp][kTile];
  __shared__ int tile_range[2];
  __shared__ int64_t tile_rows[kTile];  // pool row offsets (row * ld) of the tile's keys
  const int hd = p.head_dim, head = blockIdx.y;
  const int kvh = head / (p.n_heads / p.n_kv_heads);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kQueryTile;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  for (int i = threadIdx.x; i < kQueryTile * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd;
    qs[r][d] = t0 + r < n ? q[(t0 + r) * ldq + static_cast<int64_t>(head) * hd + d] : 0.0f;
  }
  if (threadIdx.x == 0) {
    int lo = 0x7fffffff, hi = -1;
    for (int r = 0; r < kQueryTile && t0 + r < n; ++r) {
      const int pos = positions[t0 + r];
      lo = min(lo, p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0);
      hi = max(hi, pos);
    }
    tile_range[0] = lo;
    tile_range[1] = hi;
  }
  __syncthreads();

  int my_pos[kQueriesPerWarp], my_first[kQueriesPerWarp];
  float m[kQueriesPerWarp], l[kQueriesPerWarp], acc[kQueriesPerWarp][D];
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = t0 + warp * kQueriesPerWarp + i;
    my_pos[i] = t < n ? positions[t] : -1;
    my_first[i] = p.sliding_window > 0 ? max(0, my_pos[i] - p.sliding_window + 1) : 0;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < D; ++j) acc[i][j] = 0.0f;
  }

  const int first_key = tile_range[0] / kTile * kTile, last_key = tile_range[1];
  const int32_t* table = kv.table(0);
  const int64_t head_offset = static_cast<int64_t>(kvh) * hd;
  for (int k0 = first_key; k0 <= last_key; k0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    if (threadIdx.x < kTile) {
      const int j = k0 + static_cast<int>(threadIdx.x);
      // Rows before the tile's first visible key (a sliding window's released blocks) are not read.
      tile_rows[threadIdx.x] = j >= tile_range[0] && j <= last_key ? kv.row(table, j) * kv.ld + head_offset : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * hd; i += blockDim.x) {
      const int r = i / hd, d = i % hd;
      const int64_t row = tile_rows[r];
      ks[r][d] = row >= 0 ? __half2float(kv.k[row + d]) : 0.0f;
      vs[r][d] = row >= 0 ? __half2float(kv.v[row + d]) : 0.0f;
    }
    __syncthreads();
    // Scores: lane = key k0 + lane, for this warp's queries.
    float s[kQueriesPerWarp];
#pragma unroll
    for (int i = 0; i < kQueriesPerWarp; ++i) s[i] = 0.0f;
    for (int d = 0; d < hd; ++d) {
      const float kd = ks[lane][d];
#pragma unroll
      for (int i = 0; i < kQueriesPerWarp; ++i) s[i] = fmaf(qs[warp * kQueriesPerWarp + i][d], kd, s[i]);
    }
    const int key = k0 + lane;
#pragma unroll
    for (int i = 0; i < kQueriesPerWarp; ++i) {
      float score = s[i] * p.scale;
      if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
      const bool visible = key <= my_pos[i] && key >= my_first[i];
      score = visible ? score : -INFINITY;
      const float tile_max = warp_max(score);
      const float m_new = fmaxf(m[i], tile_max);
      const float weight = m_new == -INFINITY ? 0.0f : expf(score - m_new);
      const float correction = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
      l[i] = l[i] * correction + warp_sum(weight);
      m[i] = m_new;
      ps[warp][i][lane] = weight;
#pragma unroll
      for (int j = 0; j < D; ++j) acc[i][j] *= correction;
    }
    __syncwarp();
    // P·V: lane owns head dims lane + 32 j.
    for (int r = 0; r < kTile; ++r) {
      float v[D];
#pragma unroll
      for (int j = 0; j < D; ++j) v[j] = lane + j * kWarp < hd ? vs[r][lane + j * kWarp] : 0.0f;
#pragma unroll
      for (int i = 0; i < kQueriesPerWarp; ++i) {
        const float pr = ps[warp][i][r];
#pragma unroll
        for (int j = 0; j < D; ++j) acc[i][j] = fmaf(pr, v[j], acc[i][j]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int i = 0; i < kQueriesPerWarp; ++i) {
    const int64_t t = t0 + warp * kQueriesPerWarp + i;
    if (t >= n) continue;
#pragma unroll
    for (int j = 0; j < D; ++j) {
      const int d = lane + j * kWarp;
      if (d < hd) out[t * ldo + static_cast<int64_t>(head) * hd + d] = l[i] > 0.0f ? acc[i][j] / l[i] : 0.0f;
    }
  }
}

}  // namespace

bool attention_prefill_supported(const AttentionParams& p, const KvPages& kv) {
  return p.head_dim <= kMaxPrefillHeadDim && kv.table_stride == 0;
}

void attention_prefill(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                       const AttentionParams& p, float* out, int64_t ldo, cudaStream_t stream) {
  const Pages pages = pages_of(kv);
  const dim3 grid(blocks_for(n, kQueryTile), static_cast<unsigned>(p.n_heads));
  const int threads = kPrefillWarps * kWarp;
  if (p.head_dim <= 32)
    launch(attention_prefill_kernel<1>, grid, threads, 0, stream, q, n, ldq, pages, positions, p, out, ldo);
  else if (p.head_dim <= 64)
    launch(attention_prefill_kernel<2>, grid, threads, 0, stream, q, n, ldq, pages, positions, p, out, ldo);
  else
    launch(attention_prefill_kernel<4>, grid, threads, 0, stream, q, n, ldq, pages, positions, p, out, ldo);
}

}  // namespace kettle::cuda
