// The affine codec: bit-stream codes, dequantization a group at a time, and MLX's
// quantization rule for `kettle convert`.
#include "tensor/affine_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace kettle {
namespace {


// 32 codes of B bits (B words) → 32 floats s · q + b. Unrolled per B so every shift is a
// constant; a code that straddles two words takes its high bits from the next one.
template <int B>
void dequantize_block(const uint32_t* words, float s, float b, float* out) {
  constexpr uint32_t kMask = (1u << B) - 1;
#pragma GCC unroll 32
  for (int j = 0; j < 32; ++j) {
    const int bit = j * B, word = bit / 32, shift = bit % 32;
    uint32_t q = words[word] >> shift;
    if (shift + B > 32) q |= words[word + 1] << (32 - shift);
    out[j] = s * static_cast<float>(q & kMask) + b;
  }
}

template <int B>
void dequantize_groups(const AffineRow& row, int group_size, int64_t begin, int64_t count, float* out) {
  for (int64_t e = begin; e < begin + count; e += 32) {
    const int64_t g = e / group_size, block = e / 32;
    dequantize_block<B>(row.codes + block * B, dtype_value(row.scales, row.dtype, g), dtype_value(row.biases, row.dtype, g),
                        out + (e - begin));
  }
}

void put_code(uint32_t* codes, int bits, int64_t j, uint32_t q) {
  const int64_t bit = j * bits;
  const int64_t word = bit / 32;
  const int shift = static_cast<int>(bit % 32);
  codes[word] |= q << shift;
  if (shift + bits > 32) codes[word + 1] |= q >> (32 - shift);
}

}  // namespace

bool affine_bits_supported(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

bool affine_group_size_supported(int group) { return group == 32 || group == 64 || group == 128; }

AffineRow affine_row(const Tensor& codes, const Tensor& scales, const Tensor& biases, int64_t r) {
  AffineRow row;
  row.codes = static_cast<const uint32_t*>(codes.data) + r * codes.dim(1);
  row.dtype = scales.dtype;
  const size_t sb_row = static_cast<size_t>(scales.dim(1)) * dtype_size(scales.dtype);
  row.scales = static_cast<const uint8_t*>(scales.data) + static_cast<size_t>(r) * sb_row;
  row.biases = static_cast<const uint8_t*>(biases.data) + static_cast<size_t>(r) * sb_row;
  return row;
}

void affine_dequantize(const AffineRow& row, int bits, int group_size, int64_t begin, int64_t count, float* out) {
  switch (bits) {
    case 2: return dequantize_groups<2>(row, group_size, begin, count, out);
    case 3: return dequantize_groups<3>(row, group_size, begin, count, out);
    case 4: return dequantize_groups<4>(row, group_size, begin, count, out);
    case 5: return dequantize_groups<5>(row, group_size, begin, count, out);
    case 6: return dequantize_groups<6>(row, group_size, begin, count, out);
    case 8: return dequantize_groups<8>(row, group_size, begin, count, out);
    default: std::fill_n(out, count, std::numeric_limits<float>::quiet_NaN());
  }
}

uint32_t affine_code(const uint32_t* codes, int bits, int64_t j) {
  const int64_t bit = j * bits;
  const int64_t word = bit / 32;
  const int shift = static_cast<int>(bit % 32);
  uint32_t q = codes[word] >> shift;
  if (shift + bits > 32) q |= codes[word + 1] << (32 - shift);
  return q & ((1u << bits) - 1);
}

namespace {

struct GroupFit {
  float scale = 0, bias = 0;
};

// MLX's choice for one group (see AffineFit::kMlx).
GroupFit mlx_fit(const float* v, int n, float n_bins) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (int j = 0; j < n; ++j) {
    lo = std::min(lo, v[j]);
    hi = std::max(hi, v[j]);
  }
  const bool low_edge = std::abs(lo) > std::abs(hi);
  float scale = std::max((hi - lo) / n_bins, 1e-7f);
  scale = low_edge ? scale : -scale;
  const float edge = low_edge ? lo : hi;
  const float q0 = std::rint(edge / scale);
  if (q0 == 0.0f) return {scale, 0.0f};
  return {edge / q0, edge};
}

float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

float code_of(float v, const GroupFit& f, float n_bins) {
  return std::min(std::max(std::rint((v - f.bias) / f.scale), 0.0f), n_bins);
}

double squared_error(const float* v, int n, const GroupFit& f, float n_bins) {
  double e = 0;
  for (int j = 0; j < n; ++j) {
    const double d = static_cast<double>(f.scale) * code_of(v[j], f, n_bins) + f.bias - v[j];
    e += d * d;
  }
  return e;
}

// The best of MLX's choice, plain [min, max], and a few least-squares refits of each, with
// scale and bias rounded to `stored` as they will be read.
GroupFit least_squares_fit(const float* v, int n, float n_bins, DType stored) {
  const auto rounded = [&](GroupFit f) { return GroupFit{round_to(stored, f.scale), round_to(stored, f.bias)}; };
  float lo = *std::min_element(v, v + n), hi = *std::max_element(v, v + n);
  GroupFit best = rounded(mlx_fit(v, n, n_bins));
  if (best.scale == 0.0f) best.scale = round_to(stored, 1e-7f);
  double best_error = squared_error(v, n, best, n_bins);
  for (GroupFit f : {best, rounded({std::max((hi - lo) / n_bins, 1e-7f), lo})}) {
    if (f.scale == 0.0f) continue;
    for (int round = 0; round < 4; ++round) {
      const double e = squared_error(v, n, f, n_bins);
      if (e < best_error) best_error = e, best = f;
      double sq = 0, sqq = 0, sw = 0, sqw = 0;
      for (int j = 0; j < n; ++j) {
        const double q = code_of(v[j], f, n_bins);
        sq += q, sqq += q * q, sw += v[j], sqw += q * v[j];
      }
      const double den = n * sqq - sq * sq;
      if (den <= 0) break;
      const double scale = (n * sqw - sq * sw) / den;
      const GroupFit next = rounded({static_cast<float>(scale), static_cast<float>((sw - scale * sq) / n)});
      if (next.scale == 0.0f || !std::isfinite(next.scale) || !std::isfinite(next.bias)) break;
      f = next;
    }
  }
  return best;
}

}  // namespace

void affine_quantize_row(const float* w, int64_t in, int bits, int group_size, uint32_t* codes, float* scales,
                         float* biases, AffineFit fit, DType stored) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  std::memset(codes, 0, static_cast<size_t>(in * bits / 32) * sizeof(uint32_t));
  for (int64_t g = 0; g * group_size < in; ++g) {
    const float* v = w + g * group_size;
    const GroupFit f = fit == AffineFit::kMlx ? mlx_fit(v, group_size, n_bins)
                                              : least_squares_fit(v, group_size, n_bins, stored);
    for (int j = 0; j < group_size; ++j)
      put_code(codes, bits, g * group_size + j, static_cast<uint32_t>(code_of(v[j], f, n_bins)));
    scales[g] = f.scale;
    biases[g] = f.bias;
  }
}

}  // namespace kettle
