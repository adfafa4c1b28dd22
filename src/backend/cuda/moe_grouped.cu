// Mixture of experts for prompt rows as grouped GEMMs on the tensor cores,
// with no host round trip: the rows' (token, slot) pairs are sorted by expert
// on the device (a block per expert keeps pair order), and one launch covers
// every expert's row tiles — a block finds its expert by walking the counts —
// so each chosen expert's weights are read once per 64 rows routed to it, not
// once per row. Activations enter the MMAs as two bf16 halves (x = hi + lo:
// about 16 significant bits, the exact-activation rule MoE models keep),
// weights as stored (bf16), sums in f32. A row's result depends on its own
// inputs alone (an MMA row is independent of the others), so a prompt token
// gets the same bits in any chunk.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"

namespace kettle::cuda {
namespace {

constexpr int kGemmWarps = 4;
constexpr int kTileRows = kGemmWarps * 16;  // pairs per block (16 per warp: the MMA's M)
constexpr int kTileCols = 64;               // output columns per block
constexpr int kStepK = 32;                  // reduction elements per shared-memory stage
constexpr int kRowHalves = kStepK + 8;      // padded: 16-byte aligned, ldmatrix conflict-free

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// grid (experts): block e counts the pairs routed to expert e.
__global__ void moe_count_kernel(const int32_t* __restrict__ ids, int64_t pairs, int32_t* counts) {
  grid_wait();
  const int e = blockIdx.x;
  int c = 0;
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) c += ids[i] == e;
  const float total = block_sum(static_cast<float>(c));  // exact: pairs < 2^24
  if (threadIdx.x == 0) counts[e] = static_cast<int32_t>(total);
}

// grid (experts), one warp each: expert e's pairs, in pair order, at its offset (the
// counts of the experts before it) of `sorted`.
__global__ void moe_sort_kernel(const int32_t* __restrict__ ids, int64_t pairs, const int32_t* __restrict__ counts,
                                int32_t* sorted) {
  grid_wait();
  const int e = blockIdx.x, lane = threadIdx.x;
  int offset = 0;
  for (int i = lane; i < e; i += kWarp) offset += counts[i];
  for (int o = 16; o > 0; o >>= 1) offset += __shfl_xor_sync(0xffffffffu, offset, o);
  for (int64_t base = 0; base < pairs; base += kWarp) {
    const int64_t i = base + lane;
    const bool mine = i < pairs && ids[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (mine) sorted[offset + __popc(ballot & ((1u << lane) - 1u))] = static_cast<int32_t>(i);
    offset += __popc(ballot);
  }
}

// The block's expert and first row of its list, from the global row-tile index; false
// past the last tile.
__device__ __forceinline__ bool find_tile(const int32_t* counts, int n_experts, int tile, int& expert, int& row0,
                                          int& rows, int& offset) {
  int start = 0;
  offset = 0;
  for (int e = 0; e < n_experts; ++e) {
    const int c = counts[e], tiles = (c + kTileRows - 1) / kTileRows;
    if (tile < start + tiles) {
      expert = e;
      row0 = (tile - start) * kTileRows;
      rows = min(kTileRows, c - row0);
      return true;
    }
    start += tiles;
    offset += c;
  }
  return false;
}

// out rows = A rows · Wᵀ for the block's 64 sorted pairs and 64 columns. A row of pair p:
// a + (p / a_div) * k (x by token for gate/up, h by pair for down), f32 → bf16 hi + lo.
// kGated: out = act(A·Gateᵀ) * (A·Upᵀ) (w0 gate, w1 up); else out = A·W0ᵀ. W: [cols, k].
template <bool kGated>
__global__ void __launch_bounds__(kGemmWarps* kWarp)
    moe_grouped_kernel(const float* __restrict__ a, int a_div, int64_t k, const int32_t* __restrict__ counts,
                       int n_experts, const int32_t* __restrict__ sorted, const Bf16Bits* const* w0, const Bf16Bits* const* w1, int64_t cols, Activation act,
                       float* out) {
  __shared__ __align__(16) Bf16Bits a_hi[2][kTileRows][kRowHalves];
  __shared__ __align__(16) Bf16Bits a_lo[2][kTileRows][kRowHalves];
  __shared__ __align__(16) Bf16Bits b0[2][kTileCols][kRowHalves];
  __shared__ __align__(16) Bf16Bits b1[kGated ? 2 : 1][kGated ? kTileCols : 1][kRowHalves];
  __shared__ int64_t a_rows[kTileRows];  // element offset of each tile row's A row; -1: none
  __shared__ int64_t out_rows[kTileRows];
  grid_wait();  // the counts and the sorted pairs come from the previous kernels
  int expert, row0, rows, offset;
  if (!find_tile(counts, n_experts, blockIdx.y, expert, row0, rows, offset)) return;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (threadIdx.x < kTileRows) {
    const int r = threadIdx.x;
    const int64_t pair = r < rows ? sorted[offset + row0 + r] : -1;
    a_rows[r] = pair >= 0 ? pair / a_div * k : -1;
    out_rows[r] = pair >= 0 ? pair * cols : -1;
  }
  __syncthreads();
  const Bf16Bits* g = w0[expert];
  const Bf16Bits* u = kGated ? w1[expert] : nullptr;

  // A stage: 64 rows × 32 floats as 512 float4, 4 per thread, held in registers until stored.
  float4 a_next[4];
  const auto load_a = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = threadIdx.x + i * kGemmWarps * kWarp, r = idx / 8, c = (idx % 8) * 4;
      const int64_t row = a_rows[r];
      a_next[i] = row >= 0 && k0 + c < k ? *reinterpret_cast<const float4*>(a + row + k0 + c)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  const auto store_a = [&](int stage) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = threadIdx.x + i * kGemmWarps * kWarp, r = idx / 8, c = (idx % 8) * 4;
      const float v[4] = {a_next[i].x, a_next[i].y, a_next[i].z, a_next[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat16 hi = __float2bfloat16_rn(v[j]);
        a_hi[stage][r][c + j] = __bfloat16_as_ushort(hi);
        a_lo[stage][r][c + j] = __bfloat16_as_ushort(__float2bfloat16_rn(v[j] - __bfloat162float(hi)));
      }
    }
  };
  // B stage: 64 weight rows × 32 elements as 256 16-byte pieces per matrix, 2 per thread.
  const auto load_b = [&](int stage, int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = threadIdx.x + i * kGemmWarps * kWarp, r = idx / 4, c = (idx % 4) * 8;
      const int64_t col = col0 + r;
      const bool real = col < cols && k0 + c < k;
      if (real) {
        copy16_async(&b0[stage][r][c], g + col * k + k0 + c);
        if constexpr (kGated) copy16_async(&b1[stage][r][c], u + col * k + k0 + c);
      } else {
        *reinterpret_cast<uint4*>(&b0[stage][r][c]) = make_uint4(0, 0, 0, 0);
        if constexpr (kGated) *reinterpret_cast<uint4*>(&b1[stage][r][c]) = make_uint4(0, 0, 0, 0);
      }
    }
    copies_commit();
  };

  float acc0[kTileCols / 8][4], acc1[kGated ? kTileCols / 8 : 1][4];
#pragma unroll
  for (int j = 0; j < kTileCols / 8; ++j) acc0[j][0] = acc0[j][1] = acc0[j][2] = acc0[j][3] = 0.0f;
  if constexpr (kGated) {
#pragma unroll
    for (int j = 0; j < kTileCols / 8; ++j) acc1[j][0] = acc1[j][1] = acc1[j][2] = acc1[j][3] = 0.0f;
  }
  const int steps = static_cast<int>((k + kStepK - 1) / kStepK);
  load_b(0, 0);
  load_a(0);
  store_a(0);
  for (int s = 0; s < steps; ++s) {
    const int stage = s & 1;
    if (s + 1 < steps) {
      load_b(stage ^ 1, static_cast<int64_t>(s + 1) * kStepK);
      load_a(static_cast<int64_t>(s + 1) * kStepK);
      copies_wait<1>();
    } else {
      copies_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kStepK / 16; ++ks) {
      uint32_t ah[4], al[4];
      load_matrices(ah, reinterpret_cast<const __half*>(&a_hi[stage][warp * 16 + lane % 16][ks * 16 + (lane / 16) * 8]));
      load_matrices(al, reinterpret_cast<const __half*>(&a_lo[stage][warp * 16 + lane % 16][ks * 16 + (lane / 16) * 8]));
#pragma unroll
      for (int pair = 0; pair < kTileCols / 16; ++pair) {
        const int br = pair * 16 + lane % 8 + (lane / 16) * 8, bc = ks * 16 + ((lane / 8) % 2) * 8;
        uint32_t b[4];
        load_matrices(b, reinterpret_cast<const __half*>(&b0[stage][br][bc]));
        mma_bf16(acc0[2 * pair], ah, b[0], b[1]);
        mma_bf16(acc0[2 * pair], al, b[0], b[1]);
        mma_bf16(acc0[2 * pair + 1], ah, b[2], b[3]);
        mma_bf16(acc0[2 * pair + 1], al, b[2], b[3]);
        if constexpr (kGated) {
          load_matrices(b, reinterpret_cast<const __half*>(&b1[stage][br][bc]));
          mma_bf16(acc1[2 * pair], ah, b[0], b[1]);
          mma_bf16(acc1[2 * pair], al, b[0], b[1]);
          mma_bf16(acc1[2 * pair + 1], ah, b[2], b[3]);
          mma_bf16(acc1[2 * pair + 1], al, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is read: the next-but-one may land
    if (s + 1 < steps) store_a(stage ^ 1);
  }
  // This lane: rows lane/4 (h = 0) and lane/4 + 8 (h = 1) of the warp's 16, columns
  // 8j + 2(lane % 4) + {0, 1}.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = out_rows[warp * 16 + lane / 4 + 8 * h];
    if (row < 0) continue;
#pragma unroll
    for (int j = 0; j < kTileCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = col0 + j * 8 + (lane % 4) * 2 + e;
        if (col >= cols) continue;
        float v = acc0[j][2 * h + e];
        if constexpr (kGated) v = activate(act, v) * acc1[j][2 * h + e];
        out[row + col] = v;
      }
  }
}

// grid (hidden / 256, tokens): out[t] = Σ_s weights[t, s] · y[t, s] over the slots in
// order (expert order, as the per-row path and transformers' index_add_ sum them).
__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, int top_k,
                                   int64_t hidden, float* out) {
  grid_wait();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= hidden) return;
  const int64_t t = blockIdx.y;
  float sum = 0.0f;
  for (int s = 0; s < top_k; ++s) {
    const int64_t pair = t * top_k + s;
    sum += y[pair * hidden + j] * weights[pair];
  }
  out[t * hidden + j] = sum;
}

}  // namespace

bool moe_grouped_supported(int64_t hidden, int64_t inter) {
  return hidden % 8 == 0 && inter % 8 == 0;
}

int64_t moe_grouped_workspace_bytes(int64_t n, int top_k, int n_experts, int64_t hidden) {
  return (n_experts + n * top_k) * static_cast<int64_t>(sizeof(int32_t)) + n * top_k * hidden * 4 + 256;
}

void moe_grouped(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int top_k,
                 int n_experts, const Bf16* const* table, int64_t inter, Activation act, float* h, float* out,
                 void* workspace, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t pairs = n * top_k;
  auto* counts = static_cast<int32_t*>(workspace);
  int32_t* sorted = counts + n_experts;
  float* y = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(sorted + pairs) + 255) & ~uintptr_t{255});
  launch(moe_count_kernel, static_cast<unsigned>(n_experts), 256, 0, stream, ids, pairs, counts);
  launch(moe_sort_kernel, static_cast<unsigned>(n_experts), kWarp, 0, stream, ids, pairs,
         static_cast<const int32_t*>(counts), sorted);
  // Row tiles in all: at most one partial tile per expert beyond the full ones.
  const auto tiles = static_cast<unsigned>((pairs + kTileRows - 1) / kTileRows + n_experts);
  const Bf16* const* gate = table;
  const Bf16* const* up = table + n_experts;
  const Bf16* const* down = table + 2 * n_experts;
  launch(moe_grouped_kernel<true>, dim3(blocks_for(inter, kTileCols), tiles), kGemmWarps * kWarp, 0, stream, x,
         top_k, hidden, static_cast<const int32_t*>(counts), n_experts, static_cast<const int32_t*>(sorted),
         gate, up, inter, act, h);
  launch(moe_grouped_kernel<false>, dim3(blocks_for(hidden, kTileCols), tiles), kGemmWarps * kWarp, 0, stream,
         static_cast<const float*>(h), 1, inter, static_cast<const int32_t*>(counts), n_experts,
         static_cast<const int32_t*>(sorted), down, down, hidden, act, y);
  launch(moe_combine_kernel, dim3(blocks_for(hidden, 256), static_cast<unsigned>(n)), 256, 0, stream,
         static_cast<const float*>(y), weights, top_k, hidden, out);
}

}  // namespace kettle::cuda
