// Tensor-name mapping (Hugging Face names) and shape checks. Fused
// projections (qkv_proj, gate_up_proj, stacked experts) are detected from
// the checkpoint rather than from the family, so other spellings load too.
#include "model/weights.h"

#include <fmt/format.h>

#include "model/arch/arch_table.h"
#include "util/error.h"

namespace kettle {
namespace {

class Binder {
 public:
  Binder(const WeightStore& store, const std::string& model_prefix, int64_t layer)
      : store_(store), prefix_(fmt::format("{}layers.{}.", model_prefix, layer)) {}

  bool has(const std::string& suffix) const { return store_.contains(prefix_ + suffix); }
  Tensor need(const std::string& suffix, std::vector<int64_t> shape) const { return store_.get(prefix_ + suffix, shape); }
  Tensor maybe(const std::string& suffix, std::vector<int64_t> shape) const {
    return has(suffix) ? need(suffix, std::move(shape)) : Tensor{};
  }
  // A projection `name` ("self_attn.q_proj"): name.weight [out, in] and name.bias [out],
  // the bias required, optional (bound when the checkpoint has it) or refused.
  enum class Bias { kRequired, kOptional };
  Linear linear(const std::string& name, int64_t out, int64_t in, Bias bias = Bias::kOptional) const {
    Linear l;
    l.weight = need(name + ".weight", {out, in});
    l.bias = bias == Bias::kRequired ? need(name + ".bias", {out}) : maybe(name + ".bias", {out});
    return l;
  }

 private:
  const WeightStore& store_;
  std::string prefix_;
};

// Expert e of a stacked [n_experts, rows, cols] tensor, as a [rows, cols] view.
Tensor expert_slice(const Tensor& stacked, int64_t e) {
  Tensor view = stacked;
  view.shape = {stacked.dim(1), stacked.dim(2)};
  view.data = static_cast<const uint8_t*>(stacked.data) + static_cast<size_t>(e) * view.nbytes();
  return view;
}

void bind_attention(const ModelSpec& s, const ArchTable& arch, const Binder& b, LayerWeights& w) {
  const int64_t h = s.hidden_size, q = s.q_size(), kv = s.kv_size();
  if (b.has("self_attn.qkv_proj.weight")) {
    w.qkv = b.linear("self_attn.qkv_proj", q + 2 * kv, h);
  } else {
    // Biases and q/k norms load whenever the checkpoint has them; the family table says
    // which ones must be there.
    const Binder::Bias bias = arch.qkv_bias ? Binder::Bias::kRequired : Binder::Bias::kOptional;
    w.q = b.linear("self_attn.q_proj", q, h, bias);
    w.k = b.linear("self_attn.k_proj", kv, h, bias);
    w.v = b.linear("self_attn.v_proj", kv, h, bias);
  }
  w.o = b.linear("self_attn.o_proj", h, q);
  w.q_norm = arch.qk_norm ? b.need("self_attn.q_norm.weight", {s.head_dim}) : b.maybe("self_attn.q_norm.weight", {s.head_dim});
  w.k_norm = arch.qk_norm ? b.need("self_attn.k_norm.weight", {s.head_dim}) : b.maybe("self_attn.k_norm.weight", {s.head_dim});
}

void bind_dense_mlp(const ModelSpec& s, const Binder& b, LayerWeights& w) {
  const int64_t h = s.hidden_size, inter = s.intermediate_size;
  if (b.has("mlp.gate_up_proj.weight")) {
    w.gate_up = b.linear("mlp.gate_up_proj", 2 * inter, h);
  } else {
    w.gate = b.linear("mlp.gate_proj", inter, h);
    w.up = b.linear("mlp.up_proj", inter, h);
  }
  w.down = b.linear("mlp.down_proj", h, inter);
}

void bind_experts(const ModelSpec& s, const ArchTable& arch, const Binder& b, LayerWeights& w) {
  const int64_t h = s.hidden_size, inter = s.expert_intermediate_size, n = s.n_experts;
  const std::string block = std::string(arch.moe_block) + ".";
  w.router = b.need(block + "gate.weight", {n, h});
  w.experts.resize(static_cast<size_t>(n));
  if (b.has(block + "experts.gate_up_proj")) {  // transformers 5 stacked layout
    Tensor gate_up = b.need(block + "experts.gate_up_proj", {n, 2 * inter, h});
    Tensor down = b.need(block + "experts.down_proj", {n, h, inter});
    for (int64_t e = 0; e < n; ++e) {
      Tensor both = expert_slice(gate_up, e);
      w.experts[static_cast<size_t>(e)] = {both.rows(0, inter), both.rows(inter, inter), expert_slice(down, e)};
    }
    return;
  }
  for (int64_t e = 0; e < n; ++e) {
    std::string p = fmt::format("{}experts.{}.", block, e);
    w.experts[static_cast<size_t>(e)] = {b.need(p + std::string(arch.expert_gate) + ".weight", {inter, h}),
                                         b.need(p + std::string(arch.expert_up) + ".weight", {inter, h}),
                                         b.need(p + std::string(arch.expert_down) + ".weight", {h, inter})};
  }
}

}  // namespace

ModelWeights bind_weights(const ModelSpec& s, const WeightStore& store) {
  const ArchTable& arch = arch_table(s.model_type, store.folder());
  // A causal-LM checkpoint names its decoder "model.*"; a base model (an embedding model
  // saved by sentence-transformers, Qwen3-Embedding) names it at the top level.
  const std::string prefix =
      store.contains("embed_tokens.weight") && !store.contains("model.embed_tokens.weight") ? "" : "model.";
  ModelWeights w;
  w.embed = store.get(prefix + "embed_tokens.weight", {s.vocab_size, s.hidden_size});
  w.final_norm = store.get(prefix + "norm.weight", {s.hidden_size});
  // Tied: the embedding table itself; else lm_head.weight (its absence an error naming it).
  // An embedding model's output is its hidden states: any lm_head is not read.
  if (!s.hidden_output)
    w.lm_head.weight = s.tie_word_embeddings ? w.embed : store.get("lm_head.weight", {s.vocab_size, s.hidden_size});

  w.layers.resize(static_cast<size_t>(s.n_layers));
  for (int64_t i = 0; i < s.n_layers; ++i) {
    Binder b(store, prefix, i);
    LayerWeights& lw = w.layers[static_cast<size_t>(i)];
    lw.attn_norm = b.need("input_layernorm.weight", {s.hidden_size});
    bind_attention(s, arch, b, lw);
    if (s.sandwich_norms) {
      lw.attn_post_norm = b.need("post_attention_layernorm.weight", {s.hidden_size});
      lw.ffn_norm = b.need("pre_feedforward_layernorm.weight", {s.hidden_size});
      lw.ffn_post_norm = b.need("post_feedforward_layernorm.weight", {s.hidden_size});
    } else {
      lw.ffn_norm = b.need("post_attention_layernorm.weight", {s.hidden_size});
    }
    if (s.layers[static_cast<size_t>(i)].moe) bind_experts(s, arch, b, lw);
    else bind_dense_mlp(s, b, lw);
  }
  return w;
}

}  // namespace kettle
