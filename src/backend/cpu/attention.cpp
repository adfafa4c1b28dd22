// Causal softmax attention over a paged KV cache (query t sees its sequence's
// logical rows [0, positions[t]], read through its block table), with
// grouped-query heads, Gemma-2 score softcapping and sliding windows
// (Hugging Face semantics: query i sees key j iff 0 <= i - j < window).
// Softmax in f32 with the running max subtracted, as torch's softmax does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace kettle::cpu {
namespace {

// Eight independent lanes so the compiler can vectorise without reassociating.
inline float dot(const float* a, const float* b, int n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j] * b[i + j];
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float* y, float a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void attention(ThreadPool& pool, const float* q, int64_t n, int64_t ldq, const KvPages& kv,
               const int32_t* positions, const AttentionParams& p, float* out, int64_t ldo) {
  const int group = p.n_heads / p.n_kv_heads;
  const int hd = p.head_dim;
  pool.parallel_for(n * p.n_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.n_heads;
      const int h = static_cast<int>(item % p.n_heads);
      const int kv_h = h / group;
      const int64_t pos = positions[t];
      const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
      const int64_t count = pos - first + 1;
      scores.resize(static_cast<size_t>(count));

      const float* qh = q + t * ldq + static_cast<int64_t>(h) * hd;
      float max_score = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        const float* kj = static_cast<const float*>(kv.k) + page_row(kv, t, first + j) * kv.ld + static_cast<int64_t>(kv_h) * hd;
        float s = dot(qh, kj, hd) * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        scores[static_cast<size_t>(j)] = s;
        max_score = std::max(max_score, s);
      }
      float denom = 0.0f;
      for (auto& s : scores) {
        s = std::exp(s - max_score);
        denom += s;
      }
      float* oh = out + t * ldo + static_cast<int64_t>(h) * hd;
      std::fill(oh, oh + hd, 0.0f);
      const float inv = 1.0f / denom;
      for (int64_t j = 0; j < count; ++j) {
        const float* vj = static_cast<const float*>(kv.v) + page_row(kv, t, first + j) * kv.ld + static_cast<int64_t>(kv_h) * hd;
        axpy(oh, scores[static_cast<size_t>(j)] * inv, vj, hd);
      }
    }
  });
}

}  // namespace kettle::cpu
