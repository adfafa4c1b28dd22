// RMSNorm (Llama: x·rsqrt(mean x² + eps)·w; Gemma: ·(1 + w)), the token
// embedding gather and the residual add: the CPU's small elementwise ops.
#include <cmath>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/ops.h"
#include "tensor/affine_quant.h"

namespace kettle::cpu {

void rms_norm(ThreadPool& pool, const float* x, int64_t rows, int64_t dim, int64_t ld,
              const Tensor& weight, float eps, bool add_one, float* out, int64_t ldo) {
  std::vector<float> w(static_cast<size_t>(dim));
  convert_to_f32(weight.data, weight.dtype, w.data(), dim);
  if (add_one)
    for (auto& v : w) v += 1.0f;
  pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * ld;
      float* o = out + r * ldo;
      double sum = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
      float mean = static_cast<float>(sum / static_cast<double>(dim));
      float inv = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < dim; ++i) o[i] = w[static_cast<size_t>(i)] * (xr[i] * inv);
    }
  });
}

void embed(ThreadPool& pool, const int32_t* ids, int64_t n, const Linear& table, float scale,
           float* out) {
  const Tensor& w = table.weight;
  const int64_t dim = table.in_features();
  const size_t row_bytes = static_cast<size_t>(w.dim(1)) * dtype_size(w.dtype);
  pool.parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = out + t * dim;
      if (table.scheme == WeightScheme::kAffine) {
        const AffineScales& a = table.affine;
        affine_dequantize(affine_row(w, a.scales, a.biases, ids[t]), a.bits, a.group_size, 0, dim, o);
      } else {
        convert_to_f32(static_cast<const uint8_t*>(w.data) + row_bytes * static_cast<size_t>(ids[t]), w.dtype, o, dim);
      }
      if (scale != 1.0f)
        for (int64_t i = 0; i < dim; ++i) o[i] *= scale;
    }
  });
}

void add(ThreadPool& pool, float* x, const float* y, int64_t n) {
  pool.parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
  });
}

void softcap(ThreadPool& pool, float* x, int64_t n, float cap) {
  pool.parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = cap * std::tanh(x[i] / cap);
  });
}

}  // namespace kettle::cpu
