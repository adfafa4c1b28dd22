// Gated MLP activations: SiLU (Llama, Qwen, Mistral), GELU with the tanh
// approximation (Gemma's gelu_pytorch_tanh) and exact GELU.
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
  pool.parallel_for(n * width, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t idx = begin; idx < end; ++idx) {
      int64_t t = idx / width, i = idx % width;
      out[t * ldo + i] = activate(act, gate[t * ld + i]) * up[t * ld + i];
    }
  });
}

}  // namespace kettle::cpu
