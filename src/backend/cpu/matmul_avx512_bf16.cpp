// 4-bit affine weights on AVX-512 with BF16 dot products (vdpbf16ps), the
// decode-speed path. A block of 64 codes is 32 bytes of MLX codes, byte i holding
// codes 2i (low nibble) and 2i + 1 (high nibble); widened to 16-bit words it gives
// two vectors of bf16 values 128 + q (0x4300 | q is exactly 128 + q) in four
// instructions: the even codes (w & 0xF | 0x4300) and the odd ones (w >> 4 |
// 0x4300). x is laid out to match (split_x_bf16): per block of 64, its even
// elements, then its odd ones, each as two bf16 parts, hi = bf16(x) and lo =
// bf16(x − hi) (16 significant bits, as the CUDA backend's exact rule), so each
// product is exact and only the f32 sums round. A last block of 32 (k an odd
// multiple of 32) is the same at half width. Per group g of a weight row and
// token row:
//   out += s_g · Σ (128 + q)·x  +  (b_g − 128·s_g) · Σ x
// (Σ x over the group from the same hi + lo parts). Each output is summed in an
// order fixed by k alone, so a row's bits do not depend on the batch or the
// thread split; they differ from the dense f32 matmul of the dequantized
// weights in the last bits. Other weights take the AVX-512 kernels unchanged.

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/x86_intrinsics.h"

namespace kettle {
namespace {

// A block's codes as bf16 values 128 + q: its even codes and its odd ones, 32 each (16
// each for a half block; the upper half then holds 128s, which meet zeros of x).
struct CodeBlock {
  __m512bh even, odd;
};
template <bool Half>
inline CodeBlock code_block(const uint8_t* p) {
  const __m256i bytes = Half ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
                             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i words = _mm512_cvtepu8_epi16(bytes);
  const __m512i bf16_128 = _mm512_set1_epi16(0x4300);
  return {(__m512bh)_mm512_ternarylogic_epi32(words, _mm512_set1_epi16(0xF), bf16_128, 0xEA),
          (__m512bh)_mm512_or_si512(_mm512_srli_epi16(words, 4), bf16_128)};
}

// x's even (part 0) or odd (part 1) elements of a block, as split_x_bf16 lays them out.
template <bool Half>
inline __m512bh load_x(const uint16_t* block, int part) {
  if (Half) return (__m512bh)_mm512_maskz_loadu_epi16(0xFFFF, block + 16 * part);
  return (__m512bh)_mm512_loadu_si512(block + 32 * part);
}

// Elements [i, i + 16) of an f32/bf16/f16 array as f32.
inline __m512 widen16(const uint8_t* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i))), 16));
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
    default:
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
  }
}

// Per call: x's group sums [n, groups], and each tile's rows' scales and shifted biases
// (b − 128·s) widened to f32 [R, groups].
struct TileScratch {
  std::vector<float> x_sums, scales, shifted;
};

// One block of elements [j, j + 64) (half of it when Half) of rows [0, R) of `codes` against
// token rows [c0, c0 + C) into the chains acc (x's hi part) and acc_lo (its lo part).
template <int R, int C, bool Half>
[[gnu::always_inline]] inline void accumulate_block(const uint8_t* codes, int64_t row_bytes, int64_t ahead,
                                                    const Bf16SplitX& x, int64_t k, int64_t c0, int64_t j,
                                                    __m512 (&acc)[R][C], __m512 (&acc_lo)[R][C]) {
  __m512bh xh[C][2], xl[C][2];
  for (int c = 0; c < C; ++c)
    for (int part = 0; part < 2; ++part) {
      const size_t at = static_cast<size_t>((c0 + c) * k + j);
      xh[c][part] = load_x<Half>(x.hi.data() + at, part);
      xl[c][part] = load_x<Half>(x.lo.data() + at, part);
    }
  for (int r = 0; r < R; ++r) {
    const uint8_t* p = codes + r * row_bytes + j / 2;
    if ((j & 127) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
    const CodeBlock q = code_block<Half>(p);
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][c], q.even, xh[c][0]), q.odd, xh[c][1]);
      acc_lo[r][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc_lo[r][c], q.even, xl[c][0]), q.odd, xl[c][1]);
    }
  }
}

// Weight rows [r0, r0 + R) against token rows [c0, c0 + C). vdpbf16ps has a latency of
// several cycles, so the hi and lo parts sum in chains of their own (8 chains for one
// token); every output takes the same steps whatever R and C, so its bits do not depend
// on the batch or the thread split.
template <int R, int C>
void tile(const MatmulTask& t, const Bf16SplitX& x, const float* scales, const float* shifted, const float* x_sums,
          int64_t r0, int64_t c0) {
  const int group = t.affine->group_size;
  const int64_t k = t.k, groups = k / group, row_bytes = k / 2;
  const uint8_t* codes = static_cast<const uint8_t*>(t.w) + r0 * row_bytes;
  const int64_t ahead = R * row_bytes;  // the next tile's rows (rows are contiguous): short
                                        // rows give the hardware prefetcher too little
  __m512 total[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) total[r][c] = _mm512_setzero_ps();
  // Spans of whole blocks and groups: one group of 64 or 128, or two of 32 (lanes 0-7 hold
  // the first, 8-15 the second); a last half block is one group of 32.
  const int64_t span = std::max<int64_t>(group, 64);
  for (int64_t j0 = 0; j0 < k; j0 += span) {
    const bool half = j0 + 64 > k;
    __m512 acc[R][C], acc_lo[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps(), acc_lo[r][c] = _mm512_setzero_ps();
    if (half) {
      accumulate_block<R, C, true>(codes, row_bytes, ahead, x, k, c0, j0, acc, acc_lo);
    } else {
      for (int64_t j = j0; j < j0 + span; j += 64)
        accumulate_block<R, C, false>(codes, row_bytes, ahead, x, k, c0, j, acc, acc_lo);
    }
    for (int r = 0; r < R; ++r) {
      const float* s = scales + r * groups + j0 / group;
      const __m512 sv = group == 32 && !half ? _mm512_insertf32x8(_mm512_set1_ps(s[0]), _mm256_set1_ps(s[1]), 1)
                                             : _mm512_set1_ps(s[0]);
      for (int c = 0; c < C; ++c) total[r][c] = _mm512_fmadd_ps(_mm512_add_ps(acc[r][c], acc_lo[r][c]), sv, total[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      // Σ_g (b − 128·s)_g · (Σ x)_g, 16 groups at a time, then the rest in order.
      __m512 lin = _mm512_setzero_ps();
      int64_t g = 0;
      for (; g + 16 <= groups; g += 16)
        lin = _mm512_fmadd_ps(_mm512_loadu_ps(shifted + r * groups + g), _mm512_loadu_ps(x_sums + (c0 + c) * groups + g),
                              lin);
      float linear = _mm512_reduce_add_ps(lin);
      for (; g < groups; ++g) linear += shifted[r * groups + g] * x_sums[(c0 + c) * groups + g];
      float v = _mm512_reduce_add_ps(total[r][c]) + linear;
      if (t.bias != nullptr) v += t.bias[r0 + r];
      t.out[(c0 + c) * t.ldo + r0 + r] = v;
    }
}

// Rows [r0, r0 + R) against every token row, two at a time.
template <int R>
void rows_against_tokens(const MatmulTask& t, const Bf16SplitX& x, TileScratch& s, int64_t r0) {
  const int64_t groups = t.k / t.affine->group_size;
  const size_t sb_row = static_cast<size_t>(groups) * dtype_size(t.affine->scales.dtype);
  const DType dtype = t.affine->scales.dtype;
  // The next tile's scales and biases, a tile ahead: their rows are too short a stream for
  // the hardware prefetcher, and a miss on each would stall the tile's start.
  for (size_t at = 0; at < R * sb_row; at += 64) {
    _mm_prefetch(static_cast<const char*>(t.affine->scales.data) + (r0 + R) * sb_row + at, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(t.affine->biases.data) + (r0 + R) * sb_row + at, _MM_HINT_T0);
  }
  for (int r = 0; r < R; ++r) {
    float* sc = s.scales.data() + r * groups;
    float* sh = s.shifted.data() + r * groups;
    const uint8_t* scales = static_cast<const uint8_t*>(t.affine->scales.data) + (r0 + r) * sb_row;
    const uint8_t* biases = static_cast<const uint8_t*>(t.affine->biases.data) + (r0 + r) * sb_row;
    int64_t g = 0;
    for (; g + 16 <= groups; g += 16) {  // 16 groups at a time: bf16 by a shift, f16 by vcvtph2ps
      const __m512 sv = widen16(scales, dtype, g), bv = widen16(biases, dtype, g);
      _mm512_storeu_ps(sc + g, sv);
      _mm512_storeu_ps(sh + g, _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), sv, bv));
    }
    for (; g < groups; ++g) {
      sc[g] = dtype_value(scales, dtype, g);
      sh[g] = std::fmaf(-128.0f, sc[g], dtype_value(biases, dtype, g));
    }
  }
  int64_t c = 0;
  for (; c + 2 <= t.n; c += 2) tile<R, 2>(t, x, s.scales.data(), s.shifted.data(), s.x_sums.data(), r0, c);
  if (c < t.n) tile<R, 1>(t, x, s.scales.data(), s.shifted.data(), s.x_sums.data(), r0, c);
}

}  // namespace

void matmul_rows_avx512_bf16(const MatmulTask& t, int64_t row_begin, int64_t row_end) {
  if (t.split_x == nullptr) return matmul_rows_avx512(t, row_begin, row_end);
  const Bf16SplitX& x = *t.split_x;
  thread_local TileScratch s;
  const int group = t.affine->group_size;
  const int64_t groups = t.k / group;
  s.x_sums.resize(static_cast<size_t>(t.n * groups));
  for (int64_t c = 0; c < t.n; ++c)
    for (int64_t g = 0; g < groups; ++g) s.x_sums[static_cast<size_t>(c * groups + g)] = x.group_sum(c, g * group, group);
  s.scales.resize(static_cast<size_t>(4 * groups));
  s.shifted.resize(s.scales.size());
  int64_t r = row_begin;
  for (; r + 4 <= row_end; r += 4) rows_against_tokens<4>(t, x, s, r);
  for (; r < row_end; ++r) rows_against_tokens<1>(t, x, s, r);
}

}  // namespace kettle
