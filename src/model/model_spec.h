// ModelSpec: everything that differs between architectures, as data. The
// config parser (config.cpp) fills it from config.json; the one generic
// forward (decoder_runner.cpp) reads nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/quant_config.h"

namespace kettle {

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn, kLongRope };

struct RopeSpec {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 0;  // 0: not given
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;
  double attention_factor = 0.0;  // 0: derive from the scaling type
  // longrope
  std::vector<double> short_factor;
  std::vector<double> long_factor;
};

struct LayerSpec {
  int sliding_window = 0;  // 0: full attention
  int rope = 0;            // index into ModelSpec::ropes
  bool moe = false;        // routed experts instead of a dense MLP
};

struct ModelSpec {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t max_position_embeddings = 0;

  float rms_norm_eps = 1e-6f;
  bool norm_add_one = false;    // Gemma: RMSNorm scales by (1 + w)
  bool sandwich_norms = false;  // Gemma 2/3: norms after attention and after the MLP too
  Activation act = Activation::kSilu;
  float embed_scale = 1.0f;     // Gemma: sqrt(hidden_size)
  float attn_scale = 1.0f;      // multiplies q·k
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  bool tie_word_embeddings = false;
  // An embedding model (model/embedding_spec.h): a step's output rows are the final norm's
  // hidden states [rows, hidden_size] instead of logits, and no lm_head is bound.
  bool hidden_output = false;

  int n_experts = 0;
  int experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  bool norm_topk_prob = true;

  std::vector<RopeSpec> ropes;  // [0] global; more when layer types rotate differently
  // transformers builds the model in the checkpoint's dtype, so the inv_freq buffer of its
  // rotary embedding is rounded to that dtype (bf16 for most checkpoints) before use.
  DType rope_freq_dtype = DType::kF32;
  std::vector<LayerSpec> layers;
  QuantConfig quant;  // a quantized checkpoint's bits and group sizes (none: not present())

  // The width of a step's output rows: the vocabulary (logits) or the hidden size.
  int64_t output_width() const { return hidden_output ? hidden_size : vocab_size; }
  int64_t q_size() const { return static_cast<int64_t>(n_heads) * head_dim; }
  int64_t kv_size() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
};

}  // namespace kettle
