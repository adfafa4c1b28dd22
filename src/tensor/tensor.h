// Tensor: a non-owning view of a weight (device data pointer, dtype, shape).
// Activations are plain float buffers with their shapes in comments.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace kettle {

struct Tensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  bool empty() const { return data == nullptr; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? rank() + i : i)); }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  // Rows [begin, begin + count) of the leading dimension, as a view.
  Tensor rows(int64_t begin, int64_t count) const;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace kettle
