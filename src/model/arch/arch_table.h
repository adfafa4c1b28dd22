// One row per supported model_type: the per-family switches and tensor names
// that config.json does not spell out. A new family is a new row here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace kettle {

enum class SlidingRule {
  kNone,             // no sliding window unless layer_types says so (llama)
  kAllLayers,        // sliding_window, when set, applies to every layer (mistral, mixtral, phi3)
  kFromMaxWindow,    // use_sliding_window: layers >= max_window_layers slide (qwen2, qwen3)
  kEveryNth,         // all but every n-th layer slide (gemma2: 2, gemma3: sliding_window_pattern)
};

struct ArchTable {
  std::string_view model_type;
  bool gemma_norms = false;        // RMSNorm scales by (1 + w)
  bool sandwich_norms = false;     // post-attention and post-feedforward norms
  bool scaled_embeddings = false;  // embeddings × sqrt(hidden_size)
  bool query_pre_attn_scalar = false;  // attention scale from query_pre_attn_scalar
  bool default_tie_embeddings = false;
  bool qk_norm = false;   // per-head RMSNorm of q and k (qwen3, gemma3)
  bool qkv_bias = false;  // q/k/v projections carry biases (qwen2)
  Activation default_act = Activation::kSilu;
  SlidingRule sliding = SlidingRule::kNone;
  int default_sliding_pattern = 0;  // for kEveryNth
  bool moe = false;
  std::string_view moe_block = "mlp";  // "model.layers.N.<moe_block>.experts.E..."
  std::string_view expert_gate = "gate_proj";
  std::string_view expert_up = "up_proj";
  std::string_view expert_down = "down_proj";
};

// The row for a model_type, or an error listing the supported ones.
const ArchTable& arch_table(const std::string& model_type, const std::string& config_path);
std::vector<std::string_view> supported_model_types();

}  // namespace kettle
