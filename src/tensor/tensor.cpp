// Tensor views: row slicing and shape printing.
#include "tensor/tensor.h"

namespace kettle {

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  Tensor view = *this;
  int64_t row_elements = numel() / shape.at(0);
  view.data = static_cast<const uint8_t*>(data) +
              static_cast<size_t>(begin * row_elements) * dtype_size(dtype);
  view.shape[0] = count;
  return view;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace kettle
