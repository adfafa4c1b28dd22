// The attention block's step between the q/k/v projection and attention:
// per token, optional per-head q/k RMSNorm (Qwen3, Gemma3), RoPE (the same
// rotate_half arithmetic as rope.cpp), q to its own buffer, k and v into the
// cache row of the token's position (through its block table), as they are or
// encoded by the layer's codec (tensor/kv_codec.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/ops.h"

namespace kettle::cpu {
namespace {

std::vector<float> norm_weight(const Tensor* w, bool add_one) {
  if (w == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(w->numel()));
  convert_to_f32(w->data, w->dtype, out.data(), w->numel());
  if (add_one)
    for (auto& v : out) v += 1.0f;
  return out;
}

// In place: x[0, dim) = x / sqrt(mean(x²) + eps) * w, as cpu::rms_norm computes it.
void norm_head(float* x, int dim, const std::vector<float>& w, float eps) {
  double sum = 0.0;
  for (int i = 0; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(sum / dim) + eps);
  for (int i = 0; i < dim; ++i) x[i] = w[static_cast<size_t>(i)] * (x[i] * inv);
}

void rotate_head(float* v, const float* cos_v, const float* sin_v, int half) {
  for (int i = 0; i < half; ++i) {
    float a = v[i], b = v[i + half];
    v[i] = a * cos_v[i] - b * sin_v[i];
    v[i + half] = b * cos_v[i] + a * sin_v[i];
  }
}

}  // namespace

void qkv_rope_store(ThreadPool& pool, const float* qkv, int64_t n, int64_t ld, const QkvLayout& layout,
                    const int32_t* positions, const RopeParams& rope, float* q_out, const KvPages& kv) {
  const int hd = layout.head_dim, half = rope.rotary_dim / 2;
  const int64_t qs = static_cast<int64_t>(layout.n_heads) * hd, kvs = static_cast<int64_t>(layout.n_kv_heads) * hd;
  const std::vector<float> qn = norm_weight(layout.q_norm, layout.norm_add_one);
  const std::vector<float> kn = norm_weight(layout.k_norm, layout.norm_add_one);
  const KvRowCodec &key_codec = kv.codec.key, &value_codec = kv.codec.value;
  pool.parallel_for(n, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    std::vector<float> k_row(static_cast<size_t>(key_codec.quantized() ? kvs : 0));
    for (int64_t t = begin; t < end; ++t) {
      const float* row = qkv + t * ld;
      const int64_t pos = positions[t];
      for (int i = 0; i < half; ++i) {
        float angle = static_cast<float>(pos) * rope.inv_freq[i];
        cos_v[static_cast<size_t>(i)] = std::cos(angle) * rope.attention_factor;
        sin_v[static_cast<size_t>(i)] = std::sin(angle) * rope.attention_factor;
      }
      float* q = q_out + t * qs;
      std::copy_n(row, qs, q);
      const int64_t slot = page_row(kv, t, pos);
      float* k = key_codec.quantized() ? k_row.data() : static_cast<float*>(kv.k) + slot * kv.ld;
      std::copy_n(row + qs, kvs, k);
      if (value_codec.quantized())
        kv_encode_row(value_codec, row + qs + kvs, kvs, hd, static_cast<uint8_t*>(kv.v) + slot * kv.value_row_bytes());
      else
        std::copy_n(row + qs + kvs, kvs, static_cast<float*>(kv.v) + slot * kv.ld);
      for (int h = 0; h < layout.n_heads; ++h) {
        if (!qn.empty()) norm_head(q + h * hd, hd, qn, layout.norm_eps);
        rotate_head(q + h * hd, cos_v.data(), sin_v.data(), half);
      }
      for (int h = 0; h < layout.n_kv_heads; ++h) {
        if (!kn.empty()) norm_head(k + h * hd, hd, kn, layout.norm_eps);
        rotate_head(k + h * hd, cos_v.data(), sin_v.data(), half);
      }
      if (key_codec.quantized())
        kv_encode_row(key_codec, k, kvs, hd, static_cast<uint8_t*>(kv.k) + slot * kv.key_row_bytes());
    }
  });
}

}  // namespace kettle::cpu
