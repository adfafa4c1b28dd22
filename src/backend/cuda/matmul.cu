// Decode matmuls (the rows of generated tokens): one tensor-core kernel for
// any number of rows whose sums do not depend on that number, so a token's
// product is the same bits alone or batched (batch invariance). The prompt
// rows go to cuBLAS (prompt_gemm.cpp); the small conversion and bias kernels
// that path needs live here too.
//
// The fixed reduction order, for every output y[t][r] = Σ_k x[t][k] w[r][k]:
//   - k is cut at absolute positions into chunks of 512 (kChunkSteps steps of 32);
//     a chunk's sum is one chain of m16n8k16 bf16 MMAs (f32 accumulate) in step
//     order, starting from zero;
//   - groups of 4 chunks (2048 k) sum their chunks in order, starting from zero;
//   - y sums the groups in order, starting from zero, then adds the bias.
// Whatever the row count, a warp computes whole chunks (few rows: one chunk per
// warp, for parallelism) or whole groups (more rows: fewer partial sums to pass
// on), and the last block to finish a row block adds the partial sums in that
// order. The MMA computes each output from its own row and column only, so a
// token's tile neighbours do not matter.
//
// Fragments come straight from memory with 16-byte loads: lane (g, t) = (lane /
// 4, lane % 4) loads k [8t, 8t + 8) of weight rows g and g + 8 and of token g's
// x, and the two MMAs of a step take those eight values in a fixed permuted k
// order (the same for weights and x, so the dot product is unchanged).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kTileRows = 16;      // weight rows per warp: the MMA's M
constexpr int kTileTokens = 8;     // tokens per MMA: its N
constexpr int kStepK = 32;         // k per step: two k16 MMAs over one 16-byte load per row
constexpr int kChunkSteps = 16;    // 512 k: one MMA chain
constexpr int kGroupChunks = 4;    // 2048 k
constexpr int kMaxTokenTiles = 8;  // 64 tokens per block; more tokens take more blocks (grid z)
constexpr int kBlockTokens = kMaxTokenTiles * kTileTokens;
// Up to this many tokens a warp takes one chunk (the most warps for a few rows);
// beyond it one group (a sixteenth of the partial sums to pass on).
constexpr int kChunkSplitTokens = 16;

struct DecodeBatch {
  DecodeTarget target[kMaxDecodeTargets];
  int begin[kMaxDecodeTargets + 1];  // first global row of each target; begin[count] = total
  int count;
  int gated;  // target[0] = gate, target[1] = up: out = act(gate) * up, tile i = 8 columns
  Activation act;
  float* gated_out;
  int gated_ldo;
  int accumulate;
  const void* x;  // [n, ldx] bf16 or f32 (XF32)
  int64_t ldx;
  int n, k;
  int slot_steps;      // steps per warp's slot of k: one chunk or one group
  int slots;           // slots along k (gridDim.x)
  int vrows;           // rows of the partial sums: tiles × 16
  float* partial;      // [slots, n, vrows]
  unsigned* arrivals;  // [row blocks × token blocks], zero between calls
};

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A chunk of x in shared memory, bf16, for the block's tokens: row r = token0 + r, k
// relative to the chunk. Rows are padded by 64 bytes so the eight lanes of a 16-byte
// load phase (rows g, g + 1; four k offsets each) hit distinct banks. Under the exact
// rule the rest of each value (x - bf16(x)) follows in a second array.
constexpr int kChunkK = kChunkSteps * kStepK;
constexpr int kXRow = kChunkK + 32;  // bf16 elements per shared row

template <int NT, bool Exact>
constexpr int x_stage_bytes() {
  return NT * kTileTokens * kXRow * 2 * (Exact ? 2 : 1);
}

__device__ __forceinline__ void copy_async16(void* shared, const void* global) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}

// Stages chunk c of x for `rows` tokens from token0, 16-byte units dealt to the threads:
// bf16 rows copied asynchronously, f32 rows kStageBatch units per thread at a time
// (their loads in flight together), rounded (and split, under the exact rule) here.
constexpr int kStageBatch = 4;
template <int NT, bool XF32, bool Exact>
__device__ __forceinline__ void stage_x(const DecodeBatch& p, Bf16Bits* xs, int c, int token0, int rows) {
  constexpr int kUnits = kChunkK / 8;
  const int units = rows * kUnits;
  if constexpr (!XF32) {
    for (int i = threadIdx.x; i < units; i += blockDim.x) {
      const int r = i / kUnits, u = i % kUnits, k0 = c * kChunkK + u * 8;
      Bf16Bits* dst = xs + r * kXRow + u * 8;
      if (k0 < p.k)
        copy_async16(dst, static_cast<const Bf16Bits*>(p.x) + static_cast<int64_t>(token0 + r) * p.ldx + k0);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {
    for (int i0 = threadIdx.x; i0 < units; i0 += kStageBatch * blockDim.x) {
      float4 a[kStageBatch], b[kStageBatch];
#pragma unroll
      for (int q = 0; q < kStageBatch; ++q) {
        const int i = i0 + q * static_cast<int>(blockDim.x), k0 = c * kChunkK + i % kUnits * 8;
        a[q] = b[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < units && k0 < p.k) {
          const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) +
                                                              static_cast<int64_t>(token0 + i / kUnits) * p.ldx + k0);
          a[q] = __ldg(src);
          b[q] = __ldg(src + 1);
        }
      }
#pragma unroll
      for (int q = 0; q < kStageBatch; ++q) {
        const int i = i0 + q * static_cast<int>(blockDim.x);
        if (i >= units) break;
        const float v[8] = {a[q].x, a[q].y, a[q].z, a[q].w, b[q].x, b[q].y, b[q].z, b[q].w};
        uint32_t h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          h[e] = pack_bf16(v[2 * e], v[2 * e + 1]);
          if constexpr (Exact)
            l[e] =
                pack_bf16(v[2 * e] - __uint_as_float(h[e] << 16), v[2 * e + 1] - __uint_as_float(h[e] & 0xffff0000u));
        }
        const int r = i / kUnits, u = i % kUnits;
        *reinterpret_cast<uint4*>(xs + r * kXRow + u * 8) = make_uint4(h[0], h[1], h[2], h[3]);
        if constexpr (Exact)
          *reinterpret_cast<uint4*>(xs + (NT * kTileTokens + r) * kXRow + u * 8) = make_uint4(l[0], l[1], l[2], l[3]);
      }
    }
  }
}

// One step's two MMAs (four under the exact rule: x's rounded part, then its rest).
template <bool Exact>
__device__ __forceinline__ void step_mma(float (&c)[4], const uint4& wg, const uint4& wg8, const uint4& xh,
                                         const uint4& xl) {
  mma_bf16(c, wg.x, wg8.x, wg.y, wg8.y, xh.x, xh.y);
  mma_bf16(c, wg.z, wg8.z, wg.w, wg8.w, xh.z, xh.w);
  if constexpr (Exact) {
    mma_bf16(c, wg.x, wg8.x, wg.y, wg8.y, xl.x, xl.y);
    mma_bf16(c, wg.z, wg8.z, wg.w, wg8.w, xl.z, xl.w);
  }
}

// The weight row behind partial-sum row `vrow` (clamped: rows past the end reload the
// last one and are never stored).
__device__ __forceinline__ const Bf16Bits* weight_row(const DecodeBatch& p, int vrow) {
  if (p.gated) {
    const int col = min(vrow / kTileRows * (kTileRows / 2) + vrow % (kTileRows / 2), p.target[0].rows - 1);
    return p.target[vrow % kTileRows < kTileRows / 2 ? 0 : 1].w + static_cast<size_t>(col) * p.k;
  }
  const int row = min(vrow, p.begin[p.count] - 1);
  int t = 0;
  while (t + 1 < p.count && row >= p.begin[t + 1]) ++t;
  return p.target[t].w + static_cast<size_t>(row - p.begin[t]) * p.k;
}

// The epilogue of a plain batch: y (the sum) plus bias, stored or added.
__device__ __forceinline__ void store_row(const DecodeBatch& p, int row, int token, float y) {
  int t = 0;
  while (t + 1 < p.count && row >= p.begin[t + 1]) ++t;
  const DecodeTarget& target = p.target[t];
  const int r = row - p.begin[t];
  float* out = target.out + static_cast<int64_t>(token) * target.ldo + r;
  const float v = y + (target.bias != nullptr ? target.bias[r] : 0.0f);
  *out = p.accumulate ? *out + v : v;
}

__device__ __forceinline__ void store_gated(const DecodeBatch& p, int col, int token, float gate, float up) {
  const float g = gate + (p.target[0].bias != nullptr ? p.target[0].bias[col] : 0.0f);
  const float u = up + (p.target[1].bias != nullptr ? p.target[1].bias[col] : 0.0f);
  p.gated_out[static_cast<int64_t>(token) * p.gated_ldo + col] = activate(p.act, g) * u;
}

// y from the slots' partial sums of one output, in the fixed order (chunks within a
// group, then groups). The loads of kSlotBatch slots are issued together.
constexpr int kSlotBatch = 8;
__device__ __forceinline__ float reduce_slots(const DecodeBatch& p, int token, int vrow) {
  const int slots_per_group = p.slot_steps == kChunkSteps ? kGroupChunks : 1;
  const float* src = p.partial + static_cast<int64_t>(token) * p.vrows + vrow;
  const int64_t stride = static_cast<int64_t>(p.n) * p.vrows;
  float total = 0.0f, group = 0.0f;
  for (int s0 = 0; s0 < p.slots; s0 += kSlotBatch) {
    float v[kSlotBatch];
#pragma unroll
    for (int i = 0; i < kSlotBatch; ++i) v[i] = s0 + i < p.slots ? __ldcg(src + (s0 + i) * stride) : 0.0f;
#pragma unroll
    for (int i = 0; i < kSlotBatch; ++i) {
      const int s = s0 + i;
      if (s >= p.slots) break;
      group += v[i];
      if ((s + 1) % slots_per_group == 0 || s + 1 == p.slots) {
        total += group;
        group = 0.0f;
      }
    }
  }
  return total;
}

// The last block of a row block (W tiles): every output of its rows and tokens from the
// partials, kFinishOutputs outputs per thread at a time so their loads overlap.
constexpr int kFinishOutputs = 4;
template <int W>
__device__ void finish_row_block(const DecodeBatch& p, int token0, int tokens) {
  const int tile0 = blockIdx.y * W;
  if (p.gated) {
    constexpr int kCols = W * kTileRows / 2;
    for (int i0 = threadIdx.x; i0 < kCols * tokens; i0 += kFinishOutputs * blockDim.x) {
      float gate[kFinishOutputs], up[kFinishOutputs];
#pragma unroll
      for (int u = 0; u < kFinishOutputs; ++u) {
        const int i = min(i0 + u * static_cast<int>(blockDim.x), kCols * tokens - 1), c = i % kCols;
        const int vrow = (tile0 + c / (kTileRows / 2)) * kTileRows + c % (kTileRows / 2);
        gate[u] = reduce_slots(p, token0 + i / kCols, vrow);
        up[u] = reduce_slots(p, token0 + i / kCols, vrow + kTileRows / 2);
      }
#pragma unroll
      for (int u = 0; u < kFinishOutputs; ++u) {
        const int i = i0 + u * static_cast<int>(blockDim.x), col = tile0 * (kTileRows / 2) + i % kCols;
        if (i < kCols * tokens && col < p.target[0].rows) store_gated(p, col, token0 + i / kCols, gate[u], up[u]);
      }
    }
    return;
  }
  constexpr int kRows = W * kTileRows;
  for (int i0 = threadIdx.x; i0 < kRows * tokens; i0 += kFinishOutputs * blockDim.x) {
    float y[kFinishOutputs];
#pragma unroll
    for (int u = 0; u < kFinishOutputs; ++u) {
      const int i = min(i0 + u * static_cast<int>(blockDim.x), kRows * tokens - 1);
      y[u] = reduce_slots(p, token0 + i / kRows, tile0 * kTileRows + i % kRows);
    }
#pragma unroll
    for (int u = 0; u < kFinishOutputs; ++u) {
      const int i = i0 + u * static_cast<int>(blockDim.x), row = tile0 * kTileRows + i % kRows;
      if (i < kRows * tokens && row < p.begin[p.count]) store_row(p, row, token0 + i / kRows, y[u]);
    }
  }
}

// grid: (slots along k, row blocks of W tiles, token blocks of 64). NT: token tiles of 8
// per warp; U: steps of weights per load batch (two batches in flight, issued before the
// kernel waits on its predecessor). The block stages each chunk of x in shared memory
// for all its warps.
template <int NT, int U, int W, bool XF32, bool Exact>
__global__ void __launch_bounds__(W* kWarp) decode_matmul_kernel(DecodeBatch p) {
  extern __shared__ uint4 shared_x[];
  Bf16Bits* xs = reinterpret_cast<Bf16Bits*>(shared_x);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int tile = blockIdx.y * W + warp;
  const int token0 = blockIdx.z * kBlockTokens, tokens = min(kBlockTokens, p.n - token0);
  const int staged = min(tokens, NT * kTileTokens);
  const int total_steps = (p.k + kStepK - 1) / kStepK;
  const int s_begin = blockIdx.x * p.slot_steps, s_end = min(total_steps, s_begin + p.slot_steps);
  const bool live = tile * kTileRows < p.vrows;
  const Bf16Bits* row_g = weight_row(p, min(tile, p.vrows / kTileRows - 1) * kTileRows + g);
  const Bf16Bits* row_g8 = weight_row(p, min(tile, p.vrows / kTileRows - 1) * kTileRows + g + 8);

  uint4 wa[U][2], wb[U][2];
  const auto load = [&](uint4(&dst)[U][2], int s0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = (s0 + u) * kStepK + 8 * t;
      const bool in = live && s0 + u < s_end && k0 < p.k;
      dst[u][0] = in ? load_stream(reinterpret_cast<const uint4*>(row_g + k0)) : make_uint4(0, 0, 0, 0);
      dst[u][1] = in ? load_stream(reinterpret_cast<const uint4*>(row_g8 + k0)) : make_uint4(0, 0, 0, 0);
    }
  };
  float acc[NT][4], sum[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = sum[j][e] = 0.0f;
  // B fragments: token row j·8 + g (the last staged one past the tokens), k 8t of the step.
  const Bf16Bits* x_row[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) x_row[j] = xs + min(j * kTileTokens + g, staged - 1) * kXRow + 8 * t;
  const auto consume = [&](const uint4(&src)[U][2], int s0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u;
      if (s >= s_end) break;
      const int at = (s % kChunkSteps) * kStepK;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 xh = *reinterpret_cast<const uint4*>(x_row[j] + at);
        uint4 xl = xh;
        if constexpr (Exact) xl = *reinterpret_cast<const uint4*>(x_row[j] + NT * kTileTokens * kXRow + at);
        step_mma<Exact>(acc[j], src[u][0], src[u][1], xh, xl);
      }
      if ((s + 1) % kChunkSteps == 0 || s + 1 == s_end) {  // a chunk ends: into the slot's sum
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sum[j][e] += acc[j][e];
            acc[j][e] = 0.0f;
          }
      }
    }
  };
  load(wa, s_begin);
  load(wb, s_begin + U);
  grid_wait();
  // Every warp runs every step (the stages are shared); warps past the rows load zeros.
  for (int s = s_begin; s < s_end; s += 2 * U) {
    if (s % kChunkSteps == 0) {           // a chunk starts (2U divides the chunk's steps)
      if (s != s_begin) __syncthreads();  // the last chunk's x is no longer read
      stage_x<NT, XF32, Exact>(p, xs, s / kChunkSteps, token0, staged);
      __syncthreads();
    }
    consume(wa, s);
    if (s + 2 * U < s_end) load(wa, s + 2 * U);
    consume(wb, s + U);
    if (s + 3 * U < s_end) load(wb, s + 3 * U);
  }

  // C fragment: sum[j][0..1] = row g, tokens 2t, 2t + 1 of tile j; [2..3] = row g + 8.
  if (p.slots == 1) {  // the one slot is y: the epilogue straight from registers
    if (!live) return;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = j * kTileTokens + 2 * t + e;
        if (tok >= tokens) continue;
        // The same additions reduce_slots makes for one slot: 0 + (0 + chunk sums).
        const float lo = 0.0f + (0.0f + sum[j][e]), hi = 0.0f + (0.0f + sum[j][2 + e]);
        if (p.gated) {
          const int col = tile * (kTileRows / 2) + g;
          if (col < p.target[0].rows) store_gated(p, col, token0 + tok, lo, hi);
        } else {
          const int row = tile * kTileRows + g;
          if (row < p.begin[p.count]) store_row(p, row, token0 + tok, lo);
          if (row + 8 < p.begin[p.count]) store_row(p, row + 8, token0 + tok, hi);
        }
      }
    return;
  }
  if (live) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = j * kTileTokens + 2 * t + (e & 1);
        if (tok >= tokens) continue;
        const int vrow = tile * kTileRows + g + (e >= 2 ? 8 : 0);
        p.partial[(static_cast<int64_t>(blockIdx.x) * p.n + token0 + tok) * p.vrows + vrow] = sum[j][e];
      }
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    unsigned* counter = p.arrivals + blockIdx.z * gridDim.y + blockIdx.y;
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) *counter = 0;  // left zero for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  finish_row_block<W>(p, token0, tokens);
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, int64_t k, int64_t ldx, __nv_bfloat16* out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * k) return;
  const int64_t t = i / k, c = i % k;
  out[i] = __float2bfloat16_rn(x[t * ldx + c]);
}

__global__ void to_bf16_split_kernel(const float* __restrict__ x, int64_t n, int64_t k, int64_t ldx,
                                     __nv_bfloat16* out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * k) return;
  const int64_t t = i / k, c = i % k;
  const float v = x[t * ldx + c];
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  out[i] = hi;
  out[n * k + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
}

__global__ void sum_halves_kernel(const float* __restrict__ wide, int64_t n, int64_t m, const float* __restrict__ bias,
                                  float* out, int64_t ldo, bool accumulate) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * m) return;
  const int64_t t = i / m, c = i % m;
  const float v = wide[i] + wide[n * m + i] + (bias != nullptr ? bias[c] : 0.0f);
  out[t * ldo + c] = accumulate ? out[t * ldo + c] + v : v;
}

__global__ void add_bias_kernel(float* out, int64_t n, int64_t m, int64_t ldo, const float* __restrict__ bias) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * m) return;
  const int64_t t = i / m, c = i % m;
  out[t * ldo + c] += bias[c];
}

}  // namespace

bool decode_matmul_supported(int64_t k) {
  return k % 8 == 0 && k <= (int64_t{1} << 30);
}

namespace {

int token_tiles(int n) {
  const int tiles = (std::min(n, kBlockTokens) + kTileTokens - 1) / kTileTokens;
  return tiles <= 1 ? 1 : tiles <= 2 ? 2 : tiles <= 4 ? 4 : 8;
}

// Few tokens: one chunk per warp (one group per warp measured slower at one token, 8b
// decode 157.7 against 172.5 tok/s); more: one group (B = 64: 3,578 against 3,348).
int slot_steps(int n) {
  return n <= kChunkSplitTokens ? kChunkSteps : kChunkSteps * kGroupChunks;
}

int block_warps(int n) {
  return token_tiles(n) >= 4 ? 8 : 4;
}  // as launch_decode's W

DecodeWorkspace workspace_for(int n, int k, int vrows) {
  const int steps = (k + kStepK - 1) / kStepK, per_slot = slot_steps(n);
  const int64_t slots = (steps + per_slot - 1) / per_slot;
  const int64_t row_blocks = (vrows / kTileRows + block_warps(n) - 1) / block_warps(n);
  const int64_t token_blocks = (n + kBlockTokens - 1) / kBlockTokens;
  return {slots > 1 ? slots * n * vrows : 0, row_blocks * token_blocks};
}

template <int NT, bool XF32, bool Exact>
void launch_decode(const DecodeBatch& p, cudaStream_t stream) {
  constexpr int U = NT >= 4 ? 2 : 4;  // fewer weight registers where the accumulators are many
  constexpr int W = NT >= 4 ? 8 : 4;  // more warps share a staged chunk where it is large
  constexpr int smem = x_stage_bytes<NT, Exact>();
  const auto kernel = decode_matmul_kernel<NT, U, W, XF32, Exact>;
  static const bool sized =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  (void)sized;
  const dim3 grid(static_cast<unsigned>(p.slots), blocks_for(p.vrows / kTileRows, W), blocks_for(p.n, kBlockTokens));
  launch(kernel, grid, W * kWarp, smem, stream, p);
}

template <bool XF32, bool Exact>
void launch_decode(const DecodeBatch& p, cudaStream_t stream) {
  switch (token_tiles(p.n)) {
    case 1:
      return launch_decode<1, XF32, Exact>(p, stream);
    case 2:
      return launch_decode<2, XF32, Exact>(p, stream);
    case 4:
      return launch_decode<4, XF32, Exact>(p, stream);
    default:
      return launch_decode<8, XF32, Exact>(p, stream);
  }
}

void run_decode(DecodeBatch& p, const DecodeInput& x, const DecodeScratch& scratch, cudaStream_t stream) {
  p.x = x.data;
  p.ldx = x.ld;
  p.n = x.n;
  p.k = x.k;
  p.slot_steps = slot_steps(x.n);
  p.slots = ((x.k + kStepK - 1) / kStepK + p.slot_steps - 1) / p.slot_steps;
  p.partial = scratch.partial;
  p.arrivals = scratch.arrivals;
  if (x.f32 && x.exact)
    launch_decode<true, true>(p, stream);
  else if (x.f32)
    launch_decode<true, false>(p, stream);
  else
    launch_decode<false, false>(p, stream);
}

int tiles_for(int rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

}  // namespace

DecodeWorkspace decode_matmul_workspace(int n, int k, int rows) {
  return workspace_for(n, k, tiles_for(rows) * kTileRows);
}

DecodeWorkspace decode_matmul_gated_workspace(int n, int k, int cols) {
  return workspace_for(n, k, tiles_for(2 * cols) * kTileRows);
}

void decode_matmul(const DecodeTarget* targets, int count, const DecodeInput& x, bool accumulate,
                   const DecodeScratch& scratch, cudaStream_t stream) {
  DecodeBatch p{};
  p.count = count;
  p.accumulate = accumulate ? 1 : 0;
  p.begin[0] = 0;
  for (int i = 0; i < count; ++i) {
    p.target[i] = targets[i];
    p.begin[i + 1] = p.begin[i] + targets[i].rows;
  }
  p.vrows = tiles_for(p.begin[count]) * kTileRows;
  run_decode(p, x, scratch, stream);
}

void decode_matmul_gated(const DecodeTarget& gate, const DecodeTarget& up, Activation act, const DecodeInput& x,
                         float* out, int ldo, const DecodeScratch& scratch, cudaStream_t stream) {
  DecodeBatch p{};
  p.count = 2;
  p.gated = 1;
  p.act = act;
  p.gated_out = out;
  p.gated_ldo = ldo;
  p.target[0] = gate;
  p.target[1] = up;
  p.begin[0] = 0;
  p.begin[1] = gate.rows;
  p.begin[2] = gate.rows + up.rows;
  p.vrows = tiles_for(2 * gate.rows) * kTileRows;
  run_decode(p, x, scratch, stream);
}

void to_bf16(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx, reinterpret_cast<__nv_bfloat16*>(out));
}

void to_bf16_split(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream) {
  launch(to_bf16_split_kernel, blocks_for(n * k, 256), 256, 0, stream, x, n, k, ldx,
         reinterpret_cast<__nv_bfloat16*>(out));
}

void sum_halves(const float* wide, int64_t n, int64_t m, const float* bias, float* out, int64_t ldo, bool accumulate,
                cudaStream_t stream) {
  launch(sum_halves_kernel, blocks_for(n * m, 256), 256, 0, stream, wide, n, m, bias, out, ldo, accumulate);
}

void add_bias(float* out, int64_t n, int64_t m, int64_t ldo, const float* bias, cudaStream_t stream) {
  launch(add_bias_kernel, blocks_for(n * m, 256), 256, 0, stream, out, n, m, ldo, bias);
}

}  // namespace kettle::cuda
