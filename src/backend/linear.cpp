// Linear: row views and sizes across its schemes.
#include "backend/linear.h"

#include <fmt/format.h>

namespace kettle {

Linear Linear::rows(int64_t begin, int64_t count) const {
  Linear view = *this;
  view.weight = weight.rows(begin, count);
  if (!bias.empty()) view.bias = bias.rows(begin, count);
  if (scheme == WeightScheme::kAffine) {
    view.affine.scales = affine.scales.rows(begin, count);
    view.affine.biases = affine.biases.rows(begin, count);
  }
  return view;
}

size_t Linear::weight_bytes() const {
  size_t bytes = weight.empty() ? 0 : weight.nbytes();
  if (scheme == WeightScheme::kAffine) bytes += affine.scales.nbytes() + affine.biases.nbytes();
  return bytes;
}

std::string scheme_name(const Linear& linear) {
  if (linear.scheme == WeightScheme::kAffine)
    return fmt::format("affine {}-bit, groups of {}", linear.affine.bits, linear.affine.group_size);
  return std::string(dtype_name(linear.weight.dtype));
}

}  // namespace kettle
