// Gated MLP activations: SiLU (Llama, Qwen, Mistral), GELU with the tanh
// approximation (Gemma's gelu_pytorch_tanh) and exact GELU.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"

namespace kettle::cpu {

float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: return x / (1.0f + std::exp(-x));
    case Activation::kGeluTanh: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    }
    case Activation::kGelu: return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
  }
  return x;
}

void gated_activation(ThreadPool& pool, const float* gate, const float* up, int64_t n,
                      int64_t width, int64_t ld, Activation act, float* out, int64_t ldo) {
  // Chunks of one row's columns, so a decode step (n = 1) still uses every thread.
  const int64_t chunk = 2048;
  const int64_t chunks_per_row = (width + chunk - 1) / chunk;
  pool.parallel_for(n * chunks_per_row, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / chunks_per_row, first = item % chunks_per_row * chunk;
      const int64_t last = std::min(width, first + chunk);
      const float* g = gate + t * ld;
      const float* u = up + t * ld;
      float* o = out + t * ldo;
      for (int64_t i = first; i < last; ++i) o[i] = activate(act, g[i]) * u[i];
    }
  });
}

}  // namespace kettle::cpu
