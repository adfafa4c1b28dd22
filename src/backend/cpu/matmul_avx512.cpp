// AVX-512 matmul and conversion kernels. A register tile of R weight rows ×
// C token rows keeps R·C zmm accumulators summing along k; weights are widened
// to f32 on load (bf16 exactly by a 16-bit shift, f16 by vcvtph2ps), so all
// arithmetic is f32 and activations are never rounded.

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/x86_intrinsics.h"

namespace kettle {
namespace {

struct LoadBf16 {
  using T = uint16_t;
  static __m512 widen(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }
  static __m512 load(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_tail(const T* p, __mmask16 mask) { return widen(_mm256_maskz_loadu_epi16(mask, p)); }
};

struct LoadF16 {
  using T = uint16_t;
  static __m512 load(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_tail(const T* p, __mmask16 mask) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p)); }
};

struct LoadF32 {
  using T = float;
  static __m512 load(const T* p) { return _mm512_loadu_ps(p); }
  static __m512 load_tail(const T* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
};

// One register tile over the k range [k0, k1) of a k-block.
struct TileArgs {
  const MatmulTask* task;
  int64_t r0;      // the tile's first weight row
  const void* w;   // weight row r0, element 0 (dense weights)
  int64_t ldw;     // = k
  const float* x;  // token row c0, element 0
  int64_t ldx;
  int64_t k0, k1;
  float* out;  // out[c0, r0]
  int64_t ldo;
  const float* bias;  // bias[r0] or nullptr; added by the first k-block only
  bool accumulate;    // later k-blocks add to what the earlier ones stored
};

using TileFn = void (*)(const TileArgs&);

// How a tile reads its weight rows: 16 elements at a time as f32 (tails masked).
template <class L>
struct DenseRows {
  using T = typename L::T;
  using Row = const T*;
  static constexpr int64_t kElementBytes = sizeof(T);
  static Row row(const TileArgs& a, int r) { return static_cast<const T*>(a.w) + r * a.ldw; }
  static __m512 load(Row w, int64_t i) { return L::load(w + i); }
  static __m512 load_tail(Row w, int64_t i, __mmask16 mask) { return L::load_tail(w + i, mask); }
};

// Affine rows (B bits; 0: any width, a code at a time): codes widened to s · q + b with
// their group's scale and bias. k is a multiple of 32, so there are no tails.
template <int B>
struct AffineRows {
  using Row = AffineRowView;
  static constexpr int64_t kElementBytes = 2;
  static Row row(const TileArgs& a, int r) { return affine_row_view(*a.task, a.r0 + r); }
  static __m512 load(Row& w, int64_t i) {
    float scale, bias;
    w.group(i / w.group_size, scale, bias);
    __m512i q;
    if constexpr (B == 8) {
      q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + i)));
    } else if constexpr (B == 4) {
      long long pair;
      std::memcpy(&pair, w.codes + i / 2, 8);
      const __m128i v = _mm_cvtsi64_si128(pair), low = _mm_set1_epi8(15);
      const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      q = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));  // element 2j: low nibble of byte j
    } else {
      alignas(64) int32_t c[16];
      for (int j = 0; j < 16; ++j)
        c[j] = static_cast<int32_t>(affine_code(reinterpret_cast<const uint32_t*>(w.codes), w.bits, i + j));
      q = _mm512_load_si512(c);
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale), _mm512_set1_ps(bias));
  }
  static __m512 load_tail(Row& w, int64_t i, __mmask16 /*mask*/) { return load(w, i); }
};

// Measured with bench/matmul_bench.cpp on Zen 5 (48 KiB L1d, 1 MiB L2): the
// 8×3 decode tiles beat the 4×6 GEMM tiles up to 3 tokens and lose from 4.
constexpr int64_t kGemvMaxTokens = 3;
// GEMM blocks: x block (tokens × k-block f32) 512 KiB and weight block
// (rows × k-block bf16) 256 KiB share L2; a 6-token tile of x is 24 KiB in L1.
constexpr int64_t kGemmTokens = 128;
constexpr int64_t kGemmRows = 128;
constexpr int64_t kGemmK = 1024;  // multiple of 16

struct Blocking {
  int64_t tokens;  // token rows per x block
  int64_t rows;    // weight rows per block
  int64_t k;       // k-block (a multiple of 16, or all of k)
};

// Sums the 16 lanes of each of a, b, c, d into [Σa, Σb, Σc, Σd].
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The unroll pragmas matter: at -O2 GCC does not fully unroll these loops by
// itself, and then acc[][] lives in memory and the kernel runs 4× slower.
template <class L, int R, int C>
void tile(const TileArgs& a) {
  typename L::Row w[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) w[r] = L::row(a, r);
  const float* x[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) x[c] = a.x + c * a.ldx;

  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();

  int64_t i = a.k0;
  for (; i + 16 <= a.k1; i += 16) {
    __m512 xv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) xv[c] = _mm512_loadu_ps(x[c] + i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 wv = L::load(w[r], i);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  if (i < a.k1) {
    // Masked loads read nothing past the row end, and zeros in both operands
    // keep garbage (possibly NaN bits) out of the sums.
    __mmask16 mask = static_cast<__mmask16>((1u << (a.k1 - i)) - 1);
    __m512 xv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) xv[c] = _mm512_maskz_loadu_ps(mask, x[c] + i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512 wv = L::load_tail(w[r], i, mask);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }

#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    float* o = a.out + c * a.ldo;
    int r = 0;
#pragma GCC unroll 16
    for (; r + 4 <= R; r += 4) {
      __m128 s = reduce4(acc[r][c], acc[r + 1][c], acc[r + 2][c], acc[r + 3][c]);
      if (a.accumulate) {
        s = _mm_add_ps(s, _mm_loadu_ps(o + r));
      } else if (a.bias != nullptr) {
        s = _mm_add_ps(s, _mm_loadu_ps(a.bias + r));
      }
      _mm_storeu_ps(o + r, s);
    }
#pragma GCC unroll 16
    for (; r < R; ++r) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
      if (a.accumulate) {
        s += o[r];
      } else if (a.bias != nullptr) {
        s += a.bias[r];
      }
      o[r] = s;
    }
  }
}

// table[r - 1][c - 1] = tile<L, r, c>, so ragged edges get exact-size tiles.
template <class L, int R, size_t... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> tile_row(std::index_sequence<Cs...>) {
  return {&tile<L, R, static_cast<int>(Cs) + 1>...};
}
template <class L, int C, size_t... Rs>
constexpr std::array<std::array<TileFn, C>, sizeof...(Rs)> tile_table(std::index_sequence<Rs...>) {
  return {tile_row<L, static_cast<int>(Rs) + 1>(std::make_index_sequence<C>{})...};
}

// Loop nest of one thread's rows, BLAS-style: a block of rows × a k-block of
// weights stays in L2 while every token tile meets it; a token tile (C rows ×
// the k-block) stays in L1 while every R-row tile of the block streams past.
// The x tile is the operand loaded most often (C zmm per k-step against R
// half-width weight loads), so it is the one kept closest.
// Loop nest of one thread's rows, BLAS-style: a block of weight rows × a
// k-block stays in L2 while every token tile meets it; a token tile (C rows ×
// the k-block) stays in L1 while every R-row tile of the block streams past.
// The token tile is the operand loaded most often (C zmm per k-step against R
// half-width weight loads), so it is the one kept closest.
template <class L, int R, int C>
void run_rows(const MatmulTask& t, int64_t row_begin, int64_t row_end, const Blocking& b) {
  static constexpr auto kTable = tile_table<L, C>(std::make_index_sequence<R>{});
  const auto* w = static_cast<const uint8_t*>(t.w);
  for (int64_t t0 = 0; t0 < t.n; t0 += b.tokens) {
    int64_t t1 = std::min(t.n, t0 + b.tokens);
    for (int64_t b0 = row_begin; b0 < row_end; b0 += b.rows) {
      int64_t b1 = std::min(row_end, b0 + b.rows);
      for (int64_t k0 = 0; k0 < t.k; k0 += b.k) {
        int64_t k1 = std::min(t.k, k0 + b.k);
        for (int64_t c0 = t0; c0 < t1; c0 += C) {
          int64_t cc = std::min<int64_t>(C, t1 - c0);
          for (int64_t r0 = b0; r0 < b1; r0 += R) {
            int64_t rr = std::min<int64_t>(R, b1 - r0);
            TileArgs a{&t,
                       r0,
                       w + r0 * t.k * L::kElementBytes,
                       t.k,
                       t.x + c0 * t.ldx,
                       t.ldx,
                       k0,
                       k1,
                       t.out + c0 * t.ldo + r0,
                       t.ldo,
                       t.bias ? t.bias + r0 : nullptr,
                       k0 > 0};
            kTable[rr - 1][cc - 1](a);
          }
        }
      }
    }
  }
}

template <class L>
void matmul_rows(const MatmulTask& t, int64_t row_begin, int64_t row_end) {
  if (t.n <= kGemvMaxTokens) {
    // Decode: each weight row is read once, in 8-row tiles for enough
    // independent loads and accumulators; the token rows sit in L1/L2.
    run_rows<L, 8, 3>(t, row_begin, row_end, Blocking{t.n, 8, kGemmK});
    return;
  }
  // f32 weights take twice the bytes: half the rows keep the block's size.
  int64_t rows = kGemmRows * 2 / L::kElementBytes;
  run_rows<L, 4, 6>(t, row_begin, row_end, Blocking{kGemmTokens, rows, kGemmK});
}

}  // namespace

void matmul_rows_avx512(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
  switch (task.dtype) {
    case DType::kBF16:
      return matmul_rows<DenseRows<LoadBf16>>(task, row_begin, row_end);
    case DType::kF16:
      return matmul_rows<DenseRows<LoadF16>>(task, row_begin, row_end);
    case DType::kF32:
      return matmul_rows<DenseRows<LoadF32>>(task, row_begin, row_end);
    case DType::kU32:
      if (task.affine->bits == 4) return matmul_rows<AffineRows<4>>(task, row_begin, row_end);
      if (task.affine->bits == 8) return matmul_rows<AffineRows<8>>(task, row_begin, row_end);
      return matmul_rows<AffineRows<0>>(task, row_begin, row_end);
    case DType::kF8E4M3:  // the loader widens FP8 weights first
      return;
  }
}

void convert_to_f32_avx512(const void* src, DType dtype, float* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadBf16::load(s + i));
  } else {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadF16::load(s + i));
  }
  if (i < n) {
    __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = dtype == DType::kBF16 ? LoadBf16::load_tail(s + i, mask) : LoadF16::load_tail(s + i, mask);
    _mm512_mask_storeu_ps(dst + i, mask, v);
  }
}

}  // namespace kettle
