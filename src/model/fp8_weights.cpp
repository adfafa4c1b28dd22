// Widening FP8 weights by their block, row or tensor scales.
#include "model/fp8_weights.h"

#include <memory>

#include "tensor/host_buffer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kettle {

bool is_fp8_weight(const WeightStore& store, const std::string& path) {
  return store.contains(path + ".weight") && store.get_any(path + ".weight").dtype == DType::kF8E4M3;
}

Linear widen_fp8(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out, int64_t in) {
  const Tensor w = store.get_any(path + ".weight");
  if (w.shape != std::vector<int64_t>{out, in})
    fail(ErrorCategory::kInvalidData, "{}: tensor '{}.weight' has shape {}, expected [{}, {}] from config.json",
         store.folder(), path, shape_string(w.shape), out, in);
  const std::string scale_name = path + "." + quant.fp8_scale;
  if (!store.contains(scale_name))
    fail(ErrorCategory::kInvalidData, "{}: FP8 weight '{}.weight' has no '{}' beside it", store.folder(), path,
         scale_name);
  const Tensor scale = store.get(scale_name);
  const int64_t b0 = quant.fp8_block[0], b1 = quant.fp8_block[1];
  // Where the scale of element (r, c) sits.
  int64_t rows_per_scale = 1, cols_per_scale = in, scale_cols = 1;
  if (b0 > 0) {
    const std::vector<int64_t> expected{(out + b0 - 1) / b0, (in + b1 - 1) / b1};
    if (scale.shape != expected)
      fail(ErrorCategory::kInvalidData, "{}: '{}' has shape {}; blocks of {}×{} need {}", store.folder(), scale_name,
           shape_string(scale.shape), b0, b1, shape_string(expected));
    rows_per_scale = b0, cols_per_scale = b1, scale_cols = expected[1];
  } else if (scale.numel() == 1) {
    rows_per_scale = out;
  } else if (scale.numel() != out || scale.shape[0] != out) {
    fail(ErrorCategory::kInvalidData, "{}: '{}' has shape {}; per-row scales are [{}, 1] and a tensor scale is one value",
         store.folder(), scale_name, shape_string(scale.shape), out);
  }
  auto dense = std::make_shared<HostBuffer<uint16_t>>(static_cast<size_t>(out * in));
  const auto* codes = static_cast<const uint8_t*>(w.data);
  ThreadPool pool(ThreadPool::default_threads());
  pool.parallel_for(out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const float s = dtype_value(scale.data, scale.dtype, (r / rows_per_scale) * scale_cols + c / cols_per_scale);
        dense->data()[r * in + c] = f32_to_bf16(f8e4m3_to_f32(codes[r * in + c]) * s);
      }
  });
  Linear l;
  l.weight = Tensor{dense->data(), DType::kBF16, {out, in}};
  store.add_owned(path + ".weight (widened)", l.weight, dense);
  return l;
}

}  // namespace kettle
