// Binding FP8 weights with their block, row or tensor scales.
#include "model/fp8_weights.h"

#include <memory>

#include "tensor/host_buffer.h"
#include "util/error.h"

namespace kettle {

bool is_fp8_weight(const WeightStore& store, const QuantConfig& quant, const std::string& path) {
  const bool codes = store.contains(path + ".weight") && store.get_any(path + ".weight").dtype == DType::kF8E4M3;
  // A scale with no weight yet: a store that makes its tensors as they are asked for.
  return codes || (store.contains(path + "." + quant.fp8_scale) && !store.contains(path + ".weight"));
}

Linear bind_fp8(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out, int64_t in) {
  Linear l;
  l.scheme = WeightScheme::kFp8;
  l.weight = store.get_fp8(path + ".weight", {out, in});
  const std::string scale_name = path + "." + quant.fp8_scale;
  if (!store.contains(scale_name))
    fail(ErrorCategory::kInvalidData, "{}: FP8 weight '{}.weight' has no '{}' beside it", store.folder(), path,
         scale_name);
  int64_t b0 = quant.fp8_block[0], b1 = quant.fp8_block[1];
  const Tensor scale = b0 > 0 ? store.get(scale_name, {(out + b0 - 1) / b0, (in + b1 - 1) / b1}) : store.get(scale_name);
  if (b0 <= 0 && scale.numel() == 1) {  // one for the tensor
    b0 = out, b1 = in;
  } else if (b0 <= 0 && scale.numel() == out && scale.shape[0] == out) {  // one per row
    b0 = 1, b1 = in;
  } else if (b0 <= 0) {
    fail(ErrorCategory::kInvalidData, "{}: '{}' has shape {}; per-row scales are [{}, 1] and a tensor scale is one value",
         store.folder(), scale_name, shape_string(scale.shape), out);
  }
  // The scales as an f32 grid [ceil(out / b0), ceil(in / b1)].
  const int64_t rows = (out + b0 - 1) / b0, cols = (in + b1 - 1) / b1;
  auto grid = std::make_shared<HostBuffer<float>>(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) grid->data()[i] = dtype_value(scale.data, scale.dtype, i);
  l.fp8 = {Tensor{grid->data(), DType::kF32, {rows, cols}}, b0, b1};
  store.add_owned(scale_name + " (f32 grid)", l.fp8.scales, grid);
  return l;
}

}  // namespace kettle
