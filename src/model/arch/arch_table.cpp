// The supported families. Everything not listed here is read from
// config.json or detected from which tensors the checkpoint holds
// (biases, q/k norms, fused qkv / gate_up projections).
#include "model/arch/arch_table.h"

#include <array>

#include "util/error.h"

namespace kettle {
namespace {

ArchTable llama_like(std::string_view type, SlidingRule sliding) {
  ArchTable t;
  t.model_type = type;
  t.sliding = sliding;
  return t;
}

ArchTable gemma(std::string_view type, bool sandwich, SlidingRule sliding, int pattern) {
  ArchTable t;
  t.model_type = type;
  t.gemma_norms = true;
  t.sandwich_norms = sandwich;
  t.scaled_embeddings = true;
  t.query_pre_attn_scalar = sandwich;
  t.default_tie_embeddings = true;
  t.default_act = Activation::kGeluTanh;
  t.sliding = sliding;
  t.default_sliding_pattern = pattern;
  return t;
}

ArchTable with(ArchTable t, bool qk_norm, bool qkv_bias) {
  t.qk_norm = qk_norm;
  t.qkv_bias = qkv_bias;
  return t;
}

ArchTable moe(std::string_view type, SlidingRule sliding, std::string_view block, std::string_view gate,
              std::string_view up, std::string_view down) {
  ArchTable t = llama_like(type, sliding);
  t.moe = true;
  t.moe_block = block;
  t.expert_gate = gate;
  t.expert_up = up;
  t.expert_down = down;
  return t;
}

const std::array<ArchTable, 10>& tables() {
  static const std::array<ArchTable, 10> kTables = {
      llama_like("llama", SlidingRule::kNone),
      llama_like("mistral", SlidingRule::kAllLayers),
      with(llama_like("qwen2", SlidingRule::kFromMaxWindow), false, true),
      with(llama_like("qwen3", SlidingRule::kFromMaxWindow), true, false),
      llama_like("phi3", SlidingRule::kAllLayers),
      with(moe("qwen3_moe", SlidingRule::kFromMaxWindow, "mlp", "gate_proj", "up_proj", "down_proj"), true, false),
      moe("mixtral", SlidingRule::kAllLayers, "block_sparse_moe", "w1", "w3", "w2"),
      gemma("gemma", false, SlidingRule::kNone, 0),
      gemma("gemma2", true, SlidingRule::kEveryNth, 2),
      with(gemma("gemma3_text", true, SlidingRule::kEveryNth, 6), true, false),
  };
  return kTables;
}

}  // namespace

const ArchTable& arch_table(const std::string& model_type, const std::string& config_path) {
  for (const auto& t : tables())
    if (t.model_type == model_type) return t;
  std::string list;
  for (auto name : supported_model_types()) list += (list.empty() ? "" : ", ") + std::string(name);
  fail(ErrorCategory::kUnsupported, "{}: model_type '{}' is not supported (supported: {})", config_path,
       model_type, list);
}

std::vector<std::string_view> supported_model_types() {
  std::vector<std::string_view> names;
  for (const auto& t : tables()) names.push_back(t.model_type);
  return names;
}

}  // namespace kettle
