// Portable matmul and conversion kernels: the fallback on CPUs without AVX2
// and the reference shape of the SIMD files (tiles of rows × tokens over k).
#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace kettle {
namespace {

constexpr int kRows = 4;
constexpr int kTokens = 4;
constexpr int64_t kKBlock = 256;  // widened weight strip of kRows rows stays in L1

inline void widen(const void* w, DType dtype, int64_t begin, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(w) + begin, static_cast<size_t>(count) * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(w) + begin;
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(w) + begin;
      for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3:  // the loader widens FP8 weights first
    case DType::kU32:  // packed codes: cpu_matmul dequantizes them before a kernel sees them
      return;
  }
}

// Eight partial sums, so the compiler can keep them in one vector register.
inline float dot(const float* a, const float* b, int64_t len) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j] * b[i + j];
  for (int j = 0; i < len; ++i, ++j) lanes[j] += a[i] * b[i];
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

}  // namespace

void matmul_rows_generic(const MatmulTask& t, int64_t row_begin, int64_t row_end) {
  float strip[kRows][kKBlock];
  size_t elem = dtype_size(t.dtype);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    int rr = static_cast<int>(std::min<int64_t>(kRows, row_end - r0));
    for (int64_t k0 = 0; k0 < t.k; k0 += kKBlock) {
      int64_t len = std::min(kKBlock, t.k - k0);
      for (int r = 0; r < rr; ++r) {
        if (t.affine != nullptr) {
          const AffineScales& a = *t.affine;
          const Tensor codes{t.w, DType::kU32, {r0 + r + 1, t.k * a.bits / 32}};
          affine_dequantize(affine_row(codes, a.scales, a.biases, r0 + r), a.bits, a.group_size, k0, len, strip[r]);
          continue;
        }
        const char* row = static_cast<const char*>(t.w) + (r0 + r) * t.k * static_cast<int64_t>(elem);
        widen(row, t.dtype, k0, len, strip[r]);
      }
      for (int64_t c0 = 0; c0 < t.n; c0 += kTokens) {
        int cc = static_cast<int>(std::min<int64_t>(kTokens, t.n - c0));
        float acc[kRows][kTokens] = {};
        for (int c = 0; c < cc; ++c) {
          const float* x = t.x + (c0 + c) * t.ldx + k0;
          for (int r = 0; r < rr; ++r) {
            acc[r][c] = dot(strip[r], x, len);
          }
        }
        for (int c = 0; c < cc; ++c) {
          float* o = t.out + (c0 + c) * t.ldo + r0;
          for (int r = 0; r < rr; ++r) {
            if (k0 > 0) {
              o[r] += acc[r][c];
            } else {
              o[r] = acc[r][c] + (t.bias != nullptr ? t.bias[r0 + r] : 0.0f);
            }
          }
        }
      }
    }
  }
}

void convert_to_f32_generic(const void* src, DType dtype, float* dst, int64_t n) {
  widen(src, dtype, 0, n, dst);
}

}  // namespace kettle
