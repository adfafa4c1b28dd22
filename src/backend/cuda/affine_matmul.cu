// Affine (MLX-layout) quantized weights on CUDA: 4- and 8-bit codes with a
// scale and a bias per group of k, w = s·q + b.
//
// Resident layout (affine_tile): the codes are reordered at load into tiles of
// 16 rows × 64 k, each the A operands of four m16n8k16 bf16 MMAs as the 32
// lanes of a warp hold them, so one 16-byte load per lane (two at 8 bits)
// brings a whole tile in. A lane's word s feeds MMA step s (k 16s..16s+15);
// its nibble pair (j, j + 4) is fragment register j, so one shift and one
// mask-and-or per register turn codes into bf16 pairs 128 + q (0x4300 | q is
// exactly 128 + q). At 8 bits the low and high nibbles are two such planes,
// the high one multiplied by x·16. Scales and biases (affine_tile_scales) keep
// the checkpoint's type (f32, bf16 or f16) in 16-row blocks too: per block and
// group, its 16 rows in the order 0, 8, 1, 9, ..., so the lane that holds rows
// g and g + 8 of an MMA result reads both with one load. Row blocks of 16 stay
// contiguous in all three, so the bytes of rows [r, r + 16·j) sit where the
// row-major layout has them and a Linear::rows view needs no change.
//
// Decode rows (up to 8 columns of x, or 4 under the exact rule: x as bf16
// hi + lo) run as MMAs of the code tiles against x packed in B-fragment order:
// per group, C = Σ (128 + q)·x in f32, and the row's sum gains s·C + (b −
// 128·s)·Σx (Σx of the bf16 x, per group, packed beside it). Products of bf16
// x and small integer codes are exact and the sums are f32, so the result is
// that of f32 weights s·q + b up to the order of the sums. A column's result
// never depends on the other columns: decode rows are batch invariant here.
// Prompt rows dequantize row blocks for the GEMMs (affine_dequantize): a
// weight as bf16 hi + lo parts, two GEMMs, f32-accurate as the CPU's weights.
#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kTileRows = 16, kTileK = 64, kTileLanes = 32;
constexpr int kAffineWarps = 8;
constexpr int kColumns = 8;  // the MMA's n

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Fragment registers of one MMA step: bf16 pairs 128 + q from nibbles (j, j + 4) of w.
__device__ __forceinline__ void nibble_fragment(uint32_t w, uint32_t (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = and_or(w >> (4 * j), 0x000F000Fu, 0x43004300u);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int s) {
  return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w;
}

// Where scale (or bias) (r, gi) of a matrix with `groups` groups a row sits (the head).
__host__ __device__ __forceinline__ int64_t scale_index(int64_t r, int64_t gi, int64_t groups) {
  return ((r / kTileRows) * groups + gi) * kTileRows + (r % 8) * 2 + (r % kTileRows) / 8;
}

__device__ __forceinline__ float scale_at(const void* p, int dtype, int64_t i) {
  if (dtype == kAffineScaleF32) return __ldg(static_cast<const float*>(p) + i);
  const unsigned short bits = __ldg(static_cast<const unsigned short*>(p) + i);
  if (dtype == kAffineScaleBf16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Where code (r, c) of a matrix with k columns sits in the tile layout: its byte, and
// the bit of its low nibble there (the high nibble, at 8 bits, is the same bit 16 bytes on).
struct CodePlace {
  int64_t byte;
  int bit;
};
__device__ __forceinline__ CodePlace code_place(int64_t r, int64_t c, int64_t k, int bits) {
  const int64_t tile = (r / kTileRows) * (k / kTileK) + c / kTileK;
  const int rr = static_cast<int>(r % kTileRows), cc = static_cast<int>(c % kTileK);
  const int step = cc / 16, kk = cc % 16;
  const int lane = (rr % 8) * 4 + (kk % 8) / 2;
  const int reg = (rr >= 8 ? 1 : 0) + (kk >= 8 ? 2 : 0);
  const int bit = 4 * reg + 16 * (kk % 2);
  const int lane_bytes = 16 * (bits / 4);
  return {tile * kTileLanes * lane_bytes + lane * lane_bytes + step * 4, bit};
}

__device__ __forceinline__ uint32_t tile_code(const uint8_t* codes, int64_t r, int64_t c, int64_t k, int bits) {
  const CodePlace p = code_place(r, c, k, bits);
  const uint32_t lo = (*reinterpret_cast<const uint32_t*>(codes + p.byte) >> p.bit) & 0xF;
  if (bits == 4) return lo;
  return lo | (((*reinterpret_cast<const uint32_t*>(codes + p.byte + 16) >> p.bit) & 0xF) << 4);
}

// MLX's packing: code j of a row at bit bits·j of the row's u32 stream (bits 4 or 8: no
// code crosses a word).
__global__ void affine_tile_kernel(const uint32_t* __restrict__ mlx, int64_t rows, int64_t k, int bits,
                                   uint8_t* __restrict__ tiles) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one output word
  const int64_t words = rows * k * bits / 32;
  if (i >= words) return;
  // The word's place: tile, lane, plane, step; its 8 nibbles are 4 registers × 2 elements.
  const int lane_words = 4 * (bits / 4);
  const int64_t tile = i / (kTileLanes * lane_words);
  const int within = static_cast<int>(i % (kTileLanes * lane_words));
  const int lane = within / lane_words, plane = (within % lane_words) / 4, step = within % 4;
  const int64_t r0 = (tile / (k / kTileK)) * kTileRows, c0 = (tile % (k / kTileK)) * kTileK + 16 * step;
  const int g = lane / 4, t = lane % 4;
  uint32_t out = 0;
#pragma unroll
  for (int reg = 0; reg < 4; ++reg)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t r = r0 + g + (reg & 1) * 8, c = c0 + 2 * t + e + (reg >> 1) * 8;
      const int64_t j = r * k + c;  // element index in the row-major stream
      const uint32_t code = (mlx[j * bits / 32] >> ((j * bits) % 32)) & ((1u << bits) - 1);
      out |= ((code >> (4 * plane)) & 0xF) << (4 * reg + 16 * e);
    }
  reinterpret_cast<uint32_t*>(tiles)[i] = out;
}

// Row-major scales or biases [rows, groups] of `bytes` each → the 16-row block layout.
__global__ void affine_tile_scales_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t groups, int bytes,
                                          uint8_t* __restrict__ dst) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one source element
  if (i >= rows * groups) return;
  const int64_t at = scale_index(i / groups, i % groups, groups);
  for (int b = 0; b < bytes; ++b) dst[at * bytes + b] = src[i * bytes + b];
}

__device__ __forceinline__ float dequantized(const AffineWeights& w, int64_t r, int64_t c, int64_t k) {
  const int64_t gi = scale_index(r, c / w.group_size, k / w.group_size);
  return fmaf(scale_at(w.scales, w.scale_dtype, gi), static_cast<float>(tile_code(w.codes, r, c, k, w.bits)),
              scale_at(w.biases, w.scale_dtype, gi));
}

// Eight consecutive elements of a row a thread (one group's scale and bias, one 16-byte
// store): part 0 the bf16 rounding of s·q + b, part 1 what that rounding left out.
__global__ void affine_dequantize_kernel(AffineWeights w, int64_t row0, int64_t rows, int64_t k, int part,
                                         __nv_bfloat16* __restrict__ out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one run of 8
  if (i >= rows * k / 8) return;
  const int64_t r = i / (k / 8), c0 = i % (k / 8) * 8;
  const int64_t gi = scale_index(row0 + r, c0 / w.group_size, k / w.group_size);
  const float s = scale_at(w.scales, w.scale_dtype, gi), b = scale_at(w.biases, w.scale_dtype, gi);
  float value[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) value[e] = fmaf(s, static_cast<float>(tile_code(w.codes, row0 + r, c0 + e, k, w.bits)), b);
  store_bf16_part(value, part, out + r * k + c0);
}

__global__ void affine_embed_kernel(const int32_t* __restrict__ ids, int64_t n, AffineWeights w, int64_t dim,
                                    float scale, float* __restrict__ out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  out[i] = dequantized(w, ids[i / dim], i % dim, dim) * scale;
}

// x [n, k] (row stride ldx) as the MMAs' B operand: column c = row c (split 1) or the
// bf16 hi (c = 2i) and lo (c = 2i + 1) parts of row i (split 2); columns past the rows are
// zero. packed: per tile kt, column, lane quad t: 16 bf16 (steps 0..3: k 2t, 2t+1, 2t+8,
// 2t+9); sums [groups, 8]: Σ of the column's bf16 values over each group. The first
// pack_blocks blocks pack, one element a thread; the rest sum, one warp per (group, column).
__device__ __forceinline__ float column_value(const float* x, int n, int64_t ldx, int split, int col, int64_t c) {
  const int row = col / split;
  if (row >= n) return 0.0f;
  const float xv = x[row * ldx + c];
  if (split == 1 || col % 2 == 0) return __bfloat162float(__float2bfloat16_rn(xv));
  return __bfloat162float(__float2bfloat16_rn(xv - __bfloat162float(__float2bfloat16_rn(xv))));
}

constexpr int kPackThreads = 256;

__global__ void __launch_bounds__(kPackThreads)
    affine_pack_x_kernel(const float* __restrict__ x, int n, int64_t ldx, int64_t k, int split, int group_size,
                         unsigned pack_blocks, __nv_bfloat16* __restrict__ packed, float* __restrict__ sums) {
  grid_wait();
  if (blockIdx.x < pack_blocks) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one packed element
    if (i >= k * kColumns) return;
    const int64_t kt = i / (kColumns * 64);
    const int within = static_cast<int>(i % (kColumns * 64));
    const int col = within / 64, t = (within % 64) / 16, step = (within % 16) / 4, e = within % 4;
    const int64_t c = kt * kTileK + 16 * step + 2 * t + (e & 1) + (e >> 1) * 8;
    packed[i] = __float2bfloat16_rn(column_value(x, n, ldx, split, col, c));
    return;
  }
  const int64_t w = (blockIdx.x - pack_blocks) * static_cast<int64_t>(kPackThreads / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= (k / group_size) * kColumns) return;
  const int64_t gi = w / kColumns;
  const int col = static_cast<int>(w % kColumns);
  float s = 0.0f;
  for (int64_t c = gi * group_size + lane; c < (gi + 1) * group_size; c += kWarp) s += column_value(x, n, ldx, split, col, c);
  s = warp_sum(s);
  if (lane == 0) sums[w] = s;
}

// A scale or bias pair (rows g and g + 8 of a 16-row block; i even) in f32.
template <int S>
__device__ __forceinline__ float2 scale_pair(const void* base, int i) {
  if constexpr (S == kAffineScaleF32) {
    return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + i));
  } else {
    const uint32_t v = __ldg(reinterpret_cast<const unsigned int*>(static_cast<const unsigned short*>(base) + i));
    if constexpr (S == kAffineScaleBf16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

// Blocks of the MMA kernel an SM should hold (registers bounded to fit), and tiles per load
// batch (two batches in flight): 2 for one row tile, 1 for gate's and up's. On the H100, 8
// bits decoded fastest with 3 blocks; 4 bits, once the group size became a constant, with 4
// (+2 % over 3 blocks with twice the depth, what it had; 2 blocks with either depth and 1 with
// four times it were slower; docs/performance.md).
template <int Bits>
constexpr int kMmaMinBlocks = Bits == 4 ? 4 : 3;
template <int RT>
constexpr int kMmaLoadDepth = RT == 1 ? 2 : 1;

// Per block: RT row tiles (one target's tile, or gate's and up's for the gated form) over
// all of k; the block's warps take contiguous shares of k (whole groups), and their sums
// are added in warp order. Tiles of a share go D at a time: all their loads are issued,
// then consumed. S: the scales' type; G: the group size (p.group_size), a constant so that
// where a group ends is known without a division.
template <int Bits, int RT, bool Gated, int S, int G>
__global__ void __launch_bounds__(kAffineWarps* kWarp, kMmaMinBlocks<Bits>)
    affine_mma_kernel(AffineBatch p, const uint4* __restrict__ xp, const float* __restrict__ xsum) {
  constexpr int Planes = Bits / 4, D = kMmaLoadDepth<RT>;
  constexpr int kScaleBytes = S == kAffineScaleF32 ? 4 : 2;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int64_t k = p.k;
  const int ktiles = static_cast<int>(k / kTileK), groups = static_cast<int>(k / G);
  const AffineTarget* target[RT];
  int tile[RT];
  if constexpr (Gated) {
    target[0] = &p.target[0], target[1] = &p.target[1], tile[0] = tile[1] = blockIdx.x;
  } else {
    int ti = 0;
    while (ti + 1 < p.count && static_cast<int>(blockIdx.x) >= p.first_tile[ti + 1]) ++ti;
    target[0] = &p.target[ti], tile[0] = blockIdx.x - p.first_tile[ti];
  }
  const uint4* codes[RT];
  int64_t scale0[RT];  // this lane's pair in group 0 of its block
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    codes[rt] = reinterpret_cast<const uint4*>(target[rt]->w.codes) +
                (static_cast<int64_t>(tile[rt]) * ktiles * kTileLanes + lane) * Planes;
    scale0[rt] = static_cast<int64_t>(tile[rt]) * groups * kTileRows + 2 * g;
  }
  // This lane's scale and bias pairs in group 0 of its block (group gi: gi · 16 on).
  const void* scales[RT];
  const void* biases[RT];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    scales[rt] = static_cast<const char*>(target[rt]->w.scales) + scale0[rt] * kScaleBytes;
    biases[rt] = static_cast<const char*>(target[rt]->w.biases) + scale0[rt] * kScaleBytes;
  }
  // This warp's share: whole units (a group, or a tile when groups are smaller).
  constexpr int unit = G > kTileK ? G / kTileK : 1, steps_per_group = G / 16;
  const int units = ktiles / unit;
  const int kt0 = warp * units / kAffineWarps * unit, kt1 = (warp + 1) * units / kAffineWarps * unit;
  const bool has_x = g < p.columns;
  const float offset = Bits == 4 ? 128.0f : 128.0f * 17.0f;

  float acc[RT][4] = {}, c[RT][4] = {};
  // Two batches of D tiles in flight: both issued before grid_wait() (codes never depend on
  // the previous kernel), each reloaded as soon as it is consumed.
  uint4 wa[D][RT][Planes], wb[D][RT][Planes];
  const auto load = [&](uint4(&w)[D][RT][Planes], int from) {
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int pl = 0; pl < Planes; ++pl)
          w[d][rt][pl] = from + d < kt1 ? load_stream(codes[rt] + static_cast<int64_t>(from + d) * kTileLanes * Planes + pl)
                                        : make_uint4(0, 0, 0, 0);
  };
  // The share's scales and biases into L1 while the codes come (they are read at each
  // group's end, a dependent load per group otherwise): one contiguous run per block,
  // lanes 0-15 over the scales' lines and 16-31 over the biases'.
  const int g0 = kt0 * kTileK / G, g1 = (kt1 * kTileK + G - 1) / G;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const auto* base = static_cast<const char*>(lane < 16 ? target[rt]->w.scales : target[rt]->w.biases);
    const int64_t first = (scale0[rt] - 2 * g + static_cast<int64_t>(g0) * kTileRows) * kScaleBytes;
    const int64_t last = (scale0[rt] - 2 * g + static_cast<int64_t>(g1) * kTileRows) * kScaleBytes;
    for (int64_t b = (first & ~int64_t{63}) + (lane % 16) * 64; b < last; b += 16 * 64)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(base + b));
  }
  load(wa, kt0);
  load(wb, kt0 + D);
  grid_wait();
  // x's share and its group sums into L1: one line per tile and column, and per two groups.
  if (has_x && t == 0)
    for (int kt = kt0; kt < kt1; ++kt)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(xp + (static_cast<int64_t>(kt) * kColumns + g) * 8));
  for (int gi = g0 + 2 * lane; gi < g1; gi += 2 * kWarp)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(xsum + gi * kColumns));
  const auto consume = [&](const uint4(&w)[D][RT][Planes], int kt) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (kt + d >= kt1) break;
      uint4 xv[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (has_x) {
        const uint4* src = xp + ((static_cast<int64_t>(kt + d) * kColumns + g) * 4 + t) * 2;
        xv[0] = __ldg(src), xv[1] = __ldg(src + 1);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t b0 = word(xv[s / 2], (s % 2) * 2), b1 = word(xv[s / 2], (s % 2) * 2 + 1);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          uint32_t a[4];
          nibble_fragment(word(w[d][rt][0], s), a);
          mma_bf16(c[rt], a, b0, b1);
          if constexpr (Bits == 8) {
            const __nv_bfloat162 sixteen = __float2bfloat162_rn(16.0f);
            __nv_bfloat162 x0 = *reinterpret_cast<const __nv_bfloat162*>(&b0),
                           x1 = *reinterpret_cast<const __nv_bfloat162*>(&b1);
            x0 = __hmul2(x0, sixteen), x1 = __hmul2(x1, sixteen);
            nibble_fragment(word(w[d][rt][1], s), a);
            mma_bf16(c[rt], a, *reinterpret_cast<const uint32_t*>(&x0), *reinterpret_cast<const uint32_t*>(&x1));
          }
        }
        const int step = (kt + d) * 4 + s;
        if ((step + 1) % steps_per_group == 0) {  // the group ends: scale it into the sums
          const int gi = step / steps_per_group;
          const float2 xs = __ldg(reinterpret_cast<const float2*>(xsum + gi * kColumns + 2 * t));
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            const float2 sc = scale_pair<S>(scales[rt], gi * kTileRows), bs = scale_pair<S>(biases[rt], gi * kTileRows);
            const float s2[2] = {sc.x, sc.y}, b2[2] = {fmaf(-offset, sc.x, bs.x), fmaf(-offset, sc.y, bs.y)};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              acc[rt][2 * h] = fmaf(s2[h], c[rt][2 * h], fmaf(b2[h], xs.x, acc[rt][2 * h]));
              acc[rt][2 * h + 1] = fmaf(s2[h], c[rt][2 * h + 1], fmaf(b2[h], xs.y, acc[rt][2 * h + 1]));
              c[rt][2 * h] = c[rt][2 * h + 1] = 0.0f;
            }
          }
        }
      }
    }
  };
  for (int kt = kt0; kt < kt1; kt += 2 * D) {
    consume(wa, kt);
    if (kt + 2 * D < kt1) load(wa, kt + 2 * D);
    if (kt + D < kt1) consume(wb, kt + D);
    if (kt + 3 * D < kt1) load(wb, kt + 3 * D);
  }

  // The warps' sums, added in warp order; then one output per (decode row, tile row).
  __shared__ float partial[kAffineWarps][RT][4][kWarp];
  __shared__ float total[RT][kTileRows][kColumns];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][rt][i][lane] = acc[rt][i];
  __syncthreads();
  for (int i = threadIdx.x; i < RT * kTileRows * kColumns; i += blockDim.x) {
    const int rt = i / (kTileRows * kColumns), r = (i / kColumns) % kTileRows, col = i % kColumns;
    const int from = (r % 8) * 4 + col / 2, reg = (r >= 8 ? 2 : 0) + col % 2;
    float s = 0.0f;
    for (int wi = 0; wi < kAffineWarps; ++wi) s += partial[wi][rt][reg][from];
    total[rt][r][col] = s;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.rows * kTileRows; i += blockDim.x) {
    const int row = i / kTileRows, r = i % kTileRows, col = row * p.split;
    float v[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      v[rt] = total[rt][r][col] + (p.split == 2 ? total[rt][r][col + 1] : 0.0f);
      const int m = tile[rt] * kTileRows + r;
      if (target[rt]->bias != nullptr) v[rt] += target[rt]->bias[m];
    }
    const int m = tile[0] * kTileRows + r;
    if constexpr (Gated) {
      p.gated_out[row * p.ldo + m] = activate(p.act, v[0]) * v[1];
    } else {
      float* o = target[0]->out + row * target[0]->ldo + m;
      *o = p.accumulate ? *o + v[0] : v[0];
    }
  }
}

template <int Bits, int RT, bool Gated, int S, int G>
void launch_mma(const AffineBatch& batch, unsigned blocks, const Bf16* xp, const float* xsum, cudaStream_t stream) {
  launch(affine_mma_kernel<Bits, RT, Gated, S, G>, blocks, kAffineWarps * kWarp, 0, stream, batch,
         reinterpret_cast<const uint4*>(xp), xsum);
}

// The group size.
template <int Bits, int RT, bool Gated, int S>
void launch_grouped(const AffineBatch& batch, unsigned blocks, const Bf16* xp, const float* xsum, cudaStream_t stream) {
  switch (batch.group_size) {
    case 32: return launch_mma<Bits, RT, Gated, S, 32>(batch, blocks, xp, xsum, stream);
    case 64: return launch_mma<Bits, RT, Gated, S, 64>(batch, blocks, xp, xsum, stream);
    default: return launch_mma<Bits, RT, Gated, S, 128>(batch, blocks, xp, xsum, stream);
  }
}

// The scales' type.
template <int Bits, int RT, bool Gated>
void launch_typed(const AffineBatch& batch, unsigned blocks, const Bf16* xp, const float* xsum, cudaStream_t stream) {
  switch (batch.target[0].w.scale_dtype) {
    case kAffineScaleF32: return launch_grouped<Bits, RT, Gated, kAffineScaleF32>(batch, blocks, xp, xsum, stream);
    case kAffineScaleF16: return launch_grouped<Bits, RT, Gated, kAffineScaleF16>(batch, blocks, xp, xsum, stream);
    default: return launch_grouped<Bits, RT, Gated, kAffineScaleBf16>(batch, blocks, xp, xsum, stream);
  }
}

}  // namespace

bool affine_shape_supported(int bits, int group_size, int64_t rows, int64_t k) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) &&
         rows % kTileRows == 0 && k % kTileK == 0 && k % group_size == 0 && rows < (int64_t{1} << 31) &&
         rows * k < (int64_t{1} << 40);
}

void affine_tile(const uint32_t* mlx, int64_t rows, int64_t k, int bits, void* tiles, cudaStream_t stream) {
  const int64_t words = rows * k * bits / 32;
  launch(affine_tile_kernel, blocks_for(words, 256), 256, 0, stream, mlx, rows, k, bits, static_cast<uint8_t*>(tiles));
}

void affine_tile_scales(const void* src, int64_t rows, int64_t groups, int bytes, void* dst, cudaStream_t stream) {
  launch(affine_tile_scales_kernel, blocks_for(rows * groups, 256), 256, 0, stream, static_cast<const uint8_t*>(src),
         rows, groups, bytes, static_cast<uint8_t*>(dst));
}

void affine_dequantize(const AffineWeights& w, int64_t row0, int64_t rows, int64_t k, int part, Bf16* out,
                       cudaStream_t stream) {
  launch(affine_dequantize_kernel, blocks_for(rows * k / 8, 256), 256, 0, stream, w, row0, rows, k, part,
         reinterpret_cast<__nv_bfloat16*>(out));
}

void affine_embed(const int32_t* ids, int64_t n, const AffineWeights& w, int64_t dim, float scale, float* out,
                  cudaStream_t stream) {
  launch(affine_embed_kernel, blocks_for(n * dim, 256), 256, 0, stream, ids, n, w, dim, scale, out);
}

int64_t affine_x_bytes(int64_t k, int group_size) {
  return k * kColumns * 2 + (k / group_size) * kColumns * static_cast<int64_t>(sizeof(float));
}

void affine_pack_x(const float* x, int n, int64_t ldx, int64_t k, int split, int group_size, void* workspace,
                   cudaStream_t stream) {
  auto* packed = static_cast<__nv_bfloat16*>(workspace);
  auto* sums = reinterpret_cast<float*>(static_cast<char*>(workspace) + k * kColumns * 2);
  const unsigned pack_blocks = blocks_for(k * kColumns, kPackThreads);
  const unsigned sum_blocks = blocks_for((k / group_size) * kColumns, kPackThreads / kWarp);
  launch(affine_pack_x_kernel, pack_blocks + sum_blocks, kPackThreads, 0, stream, x, n, ldx, k, split, group_size,
         pack_blocks, packed, sums);
}

void affine_matmul(const AffineBatch& batch, const void* workspace, cudaStream_t stream) {
  const auto* xp = static_cast<const Bf16*>(workspace);
  const auto* xsum = reinterpret_cast<const float*>(static_cast<const char*>(workspace) + batch.k * kColumns * 2);
  const int bits = batch.target[0].w.bits;
  if (batch.gated) {
    const unsigned blocks = static_cast<unsigned>(batch.target[0].rows / kTileRows);
    return bits == 4 ? launch_typed<4, 2, true>(batch, blocks, xp, xsum, stream)
                     : launch_typed<8, 2, true>(batch, blocks, xp, xsum, stream);
  }
  const unsigned blocks = static_cast<unsigned>(batch.first_tile[batch.count]);
  return bits == 4 ? launch_typed<4, 1, false>(batch, blocks, xp, xsum, stream)
                   : launch_typed<8, 1, false>(batch, blocks, xp, xsum, stream);
}

}  // namespace kettle::cuda
