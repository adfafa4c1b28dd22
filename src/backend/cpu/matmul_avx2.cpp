// AVX2+FMA+F16C matmul and conversion kernels: the AVX-512 file's register
// tiling at 8 lanes and 16 registers (R weight rows × C tokens, f32 sums along
// k, weights widened on load). AVX2 has no 16-bit masked loads, so k tails are
// copied into zero-padded stack buffers.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/matmul_kernels.h"

namespace kettle {
namespace {

struct LoadBf16 {
  using T = uint16_t;
  static __m256 load(const T* p) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  }
};

struct LoadF16 {
  using T = uint16_t;
  static __m256 load(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};

struct LoadF32 {
  using T = float;
  static __m256 load(const T* p) { return _mm256_loadu_ps(p); }
};

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

// How a tile reads its weight rows: 8 elements at a time as f32. Dense rows widen their
// type; k tails (k not a multiple of 8) go through a zero-padded copy.
template <class L>
struct DenseRows {
  using T = typename L::T;
  using Row = const T*;
  static constexpr int64_t kElementBytes = sizeof(T);
  static Row row(const TileArgs& a, int r) { return static_cast<const T*>(a.w) + r * a.ldw; }
  static __m256 load(Row w, int64_t i) { return L::load(w + i); }
  static __m256 load_tail(Row w, int64_t i, int64_t len) {
    alignas(32) T wt[8];
    std::memset(wt, 0, sizeof wt);
    std::memcpy(wt, w + i, static_cast<size_t>(len) * sizeof(T));
    return L::load(wt);
  }
};

// Affine rows (B bits; 0: any width, a code at a time): codes widened to s · q + b with
// their group's scale and bias. k is a multiple of 32, so there are no tails.
template <int B>
struct AffineRows {
  using Row = AffineRowView;
  static constexpr int64_t kElementBytes = 2;
  static Row row(const TileArgs& a, int r) { return affine_row_view(*a.task, a.r0 + r); }
  static __m256 load(Row& w, int64_t i) {
    float scale, bias;
    w.group(i / w.group_size, scale, bias);
    __m256i q;
    if constexpr (B == 8) {
      q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.codes + i)));
    } else if constexpr (B == 4) {
      uint32_t word;
      std::memcpy(&word, w.codes + i / 2, 4);
      q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)),
                                             _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                           _mm256_set1_epi32(15));
    } else {
      alignas(32) int32_t c[8];
      for (int j = 0; j < 8; ++j)
        c[j] = static_cast<int32_t>(affine_code(reinterpret_cast<const uint32_t*>(w.codes), w.bits, i + j));
      q = _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale), _mm256_set1_ps(bias));
  }
  static __m256 load_tail(Row& w, int64_t i, int64_t /*len*/) { return load(w, i); }
};

// 16 ymm registers: 4×2 decode tiles (8 accumulators) up to 2 tokens, 4×3
// GEMM tiles (12) beyond; blocks as in matmul_avx512.cpp.
constexpr int64_t kGemvMaxTokens = 2;
constexpr int64_t kGemmTokens = 128;
constexpr int64_t kGemmRows = 128;
constexpr int64_t kGemmK = 1024;  // multiple of 8

inline float reduce(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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

  __m256 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();

  int64_t i = a.k0;
  for (; i + 8 <= a.k1; i += 8) {
    __m256 xv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(x[c] + i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m256 wv = L::load(w[r], i);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  if (i < a.k1) {
    int64_t len = a.k1 - i;
    alignas(32) float xt[8];
    __m256 xv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      std::memset(xt, 0, sizeof xt);
      std::memcpy(xt, x[c] + i, static_cast<size_t>(len) * sizeof(float));
      xv[c] = _mm256_load_ps(xt);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m256 wv = L::load_tail(w[r], i, len);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }

#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    float* o = a.out + c * a.ldo;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float s = reduce(acc[r][c]);
      if (a.accumulate) {
        s += o[r];
      } else if (a.bias != nullptr) {
        s += a.bias[r];
      }
      o[r] = s;
    }
  }
}

template <class L, int R, size_t... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> tile_row(std::index_sequence<Cs...>) {
  return {&tile<L, R, static_cast<int>(Cs) + 1>...};
}
template <class L, int C, size_t... Rs>
constexpr std::array<std::array<TileFn, C>, sizeof...(Rs)> tile_table(std::index_sequence<Rs...>) {
  return {tile_row<L, static_cast<int>(Rs) + 1>(std::make_index_sequence<C>{})...};
}

struct Blocking {
  int64_t tokens;  // token rows per x block
  int64_t rows;    // weight rows per block
  int64_t k;       // k-block (a multiple of 8, or all of k)
};

// The loop nest of matmul_avx512.cpp: weight block in L2, token tile in L1.
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
    run_rows<L, 4, 2>(t, row_begin, row_end, Blocking{t.n, 4, kGemmK});
    return;
  }
  int64_t rows = kGemmRows * 2 / L::kElementBytes;
  run_rows<L, 4, 3>(t, row_begin, row_end, Blocking{kGemmTokens, rows, kGemmK});
}

}  // namespace

void matmul_rows_avx2(const MatmulTask& task, int64_t row_begin, int64_t row_end) {
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

void convert_to_f32_avx2(const void* src, DType dtype, float* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadBf16::load(s + i));
    for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadF16::load(s + i));
    for (; i < n; ++i) dst[i] = _cvtsh_ss(s[i]);
  }
}

}  // namespace kettle
