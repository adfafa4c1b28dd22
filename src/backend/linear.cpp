// Linear: row views, sizes and dequantized rows across its schemes.
#include "backend/linear.h"

#include <fmt/format.h>

#include "tensor/affine_quant.h"
#include "util/error.h"

namespace kettle {

bool Linear::views_rows_at(int64_t row) const {
  return scheme != WeightScheme::kFp8 || fp8.scales.dim(0) == 1 || row % fp8.block_rows == 0;
}

Linear Linear::rows(int64_t begin, int64_t count) const {
  Linear view = *this;
  view.weight = weight.rows(begin, count);
  if (!bias.empty()) view.bias = bias.rows(begin, count);
  if (scheme == WeightScheme::kAffine) {
    view.affine.scales = affine.scales.rows(begin, count);
    view.affine.biases = affine.biases.rows(begin, count);
  } else if (scheme == WeightScheme::kFp8 && fp8.scales.dim(0) > 1) {
    if (!views_rows_at(begin))
      fail(ErrorCategory::kInternal, "an FP8 weight's rows [{}, {}) start inside a block of {} rows", begin,
           begin + count, fp8.block_rows);
    const int64_t first = begin / fp8.block_rows, last = (begin + count + fp8.block_rows - 1) / fp8.block_rows;
    view.fp8.scales = fp8.scales.rows(first, last - first);
  }
  return view;
}

size_t Linear::weight_bytes() const {
  size_t bytes = weight.empty() ? 0 : weight.nbytes();
  if (scheme == WeightScheme::kAffine) bytes += affine.scales.nbytes() + affine.biases.nbytes();
  if (scheme == WeightScheme::kFp8) bytes += fp8.scales.nbytes();
  return bytes;
}

std::string scheme_name(const Linear& linear) {
  if (linear.scheme == WeightScheme::kAffine)
    return fmt::format("affine {}-bit, groups of {}", linear.affine.bits, linear.affine.group_size);
  if (linear.scheme == WeightScheme::kFp8) {
    if (linear.fp8.scales.numel() == 1) return "fp8 e4m3, one scale";
    if (linear.fp8.block_rows == 1 && linear.fp8.scales.dim(1) == 1) return "fp8 e4m3, a scale per row";
    return fmt::format("fp8 e4m3, blocks of {}×{}", linear.fp8.block_rows, linear.fp8.block_cols);
  }
  return std::string(dtype_name(linear.weight.dtype));
}

void dequantize_row(const Linear& l, int64_t r, float* out) {
  const int64_t cols = l.in_features();
  if (l.scheme == WeightScheme::kAffine) {
    affine_dequantize(affine_row(l.weight, l.affine.scales, l.affine.biases, r), l.affine.bits, l.affine.group_size, 0,
                      cols, out);
    return;
  }
  if (l.scheme != WeightScheme::kFp8)
    fail(ErrorCategory::kInternal, "dequantize_row: {} weights are not quantized", scheme_name(l));
  const auto* codes = static_cast<const uint8_t*>(l.weight.data) + r * cols;
  const auto* scales = static_cast<const float*>(l.fp8.scales.data) + (r / l.fp8.block_rows) * l.fp8.scales.dim(1);
  for (int64_t c = 0; c < cols; ++c) out[c] = f8e4m3_to_f32(codes[c]) * scales[c / l.fp8.block_cols];
}

}  // namespace kettle
