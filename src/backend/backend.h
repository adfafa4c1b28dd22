// Backend: the ops a model forward is made of. Activations are f32 buffers
// in the backend's memory (row-major, explicit row strides); weights are
// Tensor views in bf16, f16 or f32. cpu/ and (later) cuda/ implement it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace kettle {

enum class Activation { kSilu, kGeluTanh, kGelu };

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;      // multiplies q·k
  float softcap = 0.0f;    // 0: off; else scores become cap * tanh(score / cap)
  int sliding_window = 0;  // 0: full causal; else query i sees key j iff i - j < window
};

struct RopeParams {
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int rotary_dim = 0;               // leading dims of each head that rotate (NeoX halves)
  float attention_factor = 1.0f;    // scales cos and sin (YaRN, LongRoPE)
};

struct ExpertWeights {
  Tensor gate;  // [inter, hidden]
  Tensor up;    // [inter, hidden]
  Tensor down;  // [hidden, inter]
};

struct MoeParams {
  int top_k = 0;
  bool renormalize = true;  // renormalise the top-k softmax weights to sum to 1
  Activation act = Activation::kSilu;
};

// One weight of a grouped matmul: out (row stride ldo) = x · wᵀ (+ bias).
struct MatmulTarget {
  const Tensor* w;
  const Tensor* bias;  // or nullptr
  float* out;
  int64_t ldo;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // out[n, m] (row stride ldo) = x[n, k] (row stride ldx) · wᵀ (+ bias), w: [m, k], bias: [m].
  virtual void matmul(const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias,
                      float* out, int64_t ldo) = 0;

  // Several weights on the same x in one pass (q/k/v, gate/up): targets[i].out = x · targets[i].wᵀ.
  virtual void matmul_many(const float* x, int64_t n, int64_t ldx, const MatmulTarget* targets, int count) = 0;

  // out[n, dim] = table[ids[i], :] * scale
  virtual void embed(const int32_t* ids, int64_t n, const Tensor& table, float scale, float* out) = 0;

  // Per row of x [rows, dim] (stride ld): out = x / sqrt(mean(x²) + eps) * (add_one ? 1 + w : w).
  // out may alias x.
  virtual void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight,
                        float eps, bool add_one, float* out, int64_t ldo) = 0;

  // x[i] += y[i] for i < n
  virtual void add(float* x, const float* y, int64_t n) = 0;

  // Rotates x [n_tokens, n_heads, head_dim] (token stride ld) in place, HF rotate_half layout.
  virtual void rope(float* x, int64_t n_tokens, int64_t ld, int n_heads, int head_dim,
                    const int32_t* positions, const RopeParams& rope) = 0;

  // out[t, i] = act(gate[t, i]) * up[t, i] for t < n, i < width; gate/up rows share stride ld.
  virtual void gated_activation(const float* gate, const float* up, int64_t n, int64_t width,
                                int64_t ld, Activation act, float* out, int64_t ldo) = 0;

  // Causal attention for n queries at positions [start, start + n) over the cache rows
  // [0, start + n). q: [n, n_heads * head_dim] (stride ldq); caches: [pos, n_kv_heads * head_dim]
  // (stride ld_kv); out: [n, n_heads * head_dim] (stride ldo).
  virtual void attention(const float* q, int64_t n, int64_t ldq, const float* k_cache,
                         const float* v_cache, int64_t ld_kv, int64_t start,
                         const AttentionParams& params, float* out, int64_t ldo) = 0;

  // x[i] = cap * tanh(x[i] / cap)
  virtual void softcap(float* x, int64_t n, float cap) = 0;

  // Routed mixture of experts: out[n, hidden] = Σ_topk p_e · down_e(act(gate_e x) · up_e x),
  // with router logits = x · routerᵀ and p = softmax over all experts (renormalised over top-k).
  virtual void moe(const float* x, int64_t n, int64_t hidden, const Tensor& router,
                   const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace kettle
