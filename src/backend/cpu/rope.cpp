// Rotary position embedding in the Hugging Face rotate_half layout: the
// first rotary_dim/2 dims pair with the next rotary_dim/2 (GPT-NeoX style).
// Angles are computed as torch does: float32 position × float32 inv_freq.
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace kettle::cpu {

void rope(ThreadPool& pool, float* x, int64_t n_tokens, int64_t ld, int n_heads, int head_dim,
          const int32_t* positions, const RopeParams& rope) {
  const int half = rope.rotary_dim / 2;
  (void)head_dim;
  pool.parallel_for(n_tokens, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      float pos = static_cast<float>(positions[t]);
      for (int i = 0; i < half; ++i) {
        float angle = pos * rope.inv_freq[i];
        cos_v[static_cast<size_t>(i)] = std::cos(angle) * rope.attention_factor;
        sin_v[static_cast<size_t>(i)] = std::sin(angle) * rope.attention_factor;
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + t * ld + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          float c = cos_v[static_cast<size_t>(i)], s = sin_v[static_cast<size_t>(i)];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
    }
  });
}

}  // namespace kettle::cpu
