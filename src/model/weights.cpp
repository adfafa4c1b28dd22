// Tensor-name mapping (Hugging Face names) and shape checks. Fused
// projections (qkv_proj, gate_up_proj, stacked experts) are detected from
// the checkpoint rather than from the family, so other spellings load too.
#include "model/weights.h"

#include <fmt/format.h>

#include "model/arch/arch_table.h"
#include "model/fp8_weights.h"
#include "model/zero_point_repack.h"
#include "util/error.h"

namespace kettle {
namespace {

// Expert e of a stacked [n_experts, rows, cols] tensor, as a [rows, cols] view.
Tensor expert_slice(const Tensor& stacked, int64_t e) {
  Tensor view = stacked;
  view.shape = {stacked.dim(1), stacked.dim(2)};
  view.data = static_cast<const uint8_t*>(stacked.data) + static_cast<size_t>(e) * view.nbytes();
  return view;
}

// The MLX affine module at `path` (path.scales present): its bits and group size from
// config.json, codes, scales and biases each of shape lead + [out, …] checked against
// them; lead is {} for one module, {n} for n stacked experts.
Linear bind_affine(const WeightStore& store, const QuantConfig& quant, const std::string& path,
                   std::vector<int64_t> lead, int64_t out, int64_t in) {
  const QuantParams p = quant.for_module(path);
  if (quant.method != QuantMethod::kMlxAffine)
    fail(ErrorCategory::kInvalidData, "{}: tensor '{}.scales' is an MLX quantized weight's, but config.json has no "
         "'quantization' to say its bits and group size", store.folder(), path);
  if (!p.quantized)
    fail(ErrorCategory::kInvalidData, "{}: config.json leaves '{}' unquantized, but the checkpoint holds '{}.scales'",
         store.folder(), path, path);
  if (in % p.group_size != 0 || (in * p.bits) % 32 != 0)
    fail(ErrorCategory::kInvalidData, "{}: '{}' has {} inputs, not a multiple of its group size {}", store.folder(),
         path, in, p.group_size);
  const auto shape = [&](int64_t last) {
    std::vector<int64_t> s = lead;
    s.insert(s.end(), {out, last});
    return s;
  };
  Linear l;
  l.scheme = WeightScheme::kAffine;
  l.affine.bits = p.bits;
  l.affine.group_size = p.group_size;
  l.weight = store.get_codes(path + ".weight", shape(in * p.bits / 32));
  l.affine.scales = store.get(path + ".scales", shape(in / p.group_size));
  l.affine.biases = store.get(path + ".biases", shape(in / p.group_size));
  if (l.affine.biases.dtype != l.affine.scales.dtype)
    fail(ErrorCategory::kInvalidData, "{}: '{}.biases' is {} but its scales are {}", store.folder(), path,
         dtype_name(l.affine.biases.dtype), dtype_name(l.affine.scales.dtype));
  return l;
}

// The module at `path` ("model.layers.0.self_attn.q_proj", "lm_head") as a Linear [out, in]:
// dense (path.weight); affine when the checkpoint holds path.scales (as MLX decides); AWQ
// or GPTQ (path.qweight) repacked into the affine layout; FP8 codes with their scales.
Linear bind_linear(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out,
                   int64_t in) {
  if (store.contains(path + ".qweight")) {
    if (quant.method != QuantMethod::kAwq && quant.method != QuantMethod::kGptq)
      fail(ErrorCategory::kInvalidData, "{}: tensor '{}.qweight' is an AWQ or GPTQ weight's, but config.json's "
           "quantization_config names neither", store.folder(), path);
    return repack_zero_point(store, quant, path, out, in);
  }
  if (quant.method == QuantMethod::kFp8 && is_fp8_weight(store, quant, path)) return bind_fp8(store, quant, path, out, in);
  if (store.contains(path + ".scales")) return bind_affine(store, quant, path, {}, out, in);
  Linear l;
  l.weight = store.get(path + ".weight", {out, in});
  return l;
}

class Binder {
 public:
  Binder(const WeightStore& store, const QuantConfig& quant, const std::string& model_prefix, int64_t layer)
      : store_(store), quant_(quant), prefix_(fmt::format("{}layers.{}.", model_prefix, layer)) {}

  bool has(const std::string& suffix) const { return store_.contains(prefix_ + suffix); }
  // A projection in any of its layouts (float or MLX .weight, AWQ/GPTQ .qweight).
  bool has_linear(const std::string& name) const { return has(name + ".weight") || has(name + ".qweight"); }
  Tensor need(const std::string& suffix, std::vector<int64_t> shape) const { return store_.get(prefix_ + suffix, shape); }
  Tensor maybe(const std::string& suffix, std::vector<int64_t> shape) const {
    return has(suffix) ? need(suffix, std::move(shape)) : Tensor{};
  }
  // A projection `name` ("self_attn.q_proj"): name.weight [out, in] (or its quantized
  // parts) and name.bias [out], the bias required or optional (bound when the checkpoint
  // has it).
  enum class Bias { kRequired, kOptional };
  Linear linear(const std::string& name, int64_t out, int64_t in, Bias bias = Bias::kOptional) const {
    Linear l = bind_linear(store_, quant_, prefix_ + name, out, in);
    l.bias = bias == Bias::kRequired ? need(name + ".bias", {out}) : maybe(name + ".bias", {out});
    return l;
  }
  // A projection without its bias (routers and experts: their kernels add none; a bias
  // the checkpoint holds is refused by name rather than left out).
  Linear unbiased(const std::string& name, int64_t out, int64_t in) const {
    refuse_bias(name);
    return bind_linear(store_, quant_, prefix_ + name, out, in);
  }
  void refuse_bias(const std::string& name) const {
    if (has(name + ".bias"))
      fail(ErrorCategory::kUnsupported, "{}: '{}{}.bias': biased routers and experts are not supported",
           store_.folder(), prefix_, name);
  }
  // A stacked [n, out, in] projection (MLX's switch_mlp; dense, or affine with stacked
  // scales and biases) as n Linears over its slices.
  std::vector<Linear> stacked(const std::string& name, int64_t n, int64_t out, int64_t in) const;

 private:
  const WeightStore& store_;
  const QuantConfig& quant_;
  std::string prefix_;
};

std::vector<Linear> Binder::stacked(const std::string& name, int64_t n, int64_t out, int64_t in) const {
  refuse_bias(name);
  std::vector<Linear> experts(static_cast<size_t>(n));
  if (!has(name + ".scales")) {
    const Tensor w = need(name + ".weight", {n, out, in});
    for (int64_t e = 0; e < n; ++e) experts[static_cast<size_t>(e)].weight = expert_slice(w, e);
    return experts;
  }
  // One affine module per expert over the stacked parts (bits and group size: the stacked
  // module's own, mlx-lm's per-module override, when config.json has one).
  const Linear all = bind_affine(store_, quant_, prefix_ + name, {n}, out, in);
  for (int64_t e = 0; e < n; ++e) {
    Linear& l = experts[static_cast<size_t>(e)];
    l.scheme = WeightScheme::kAffine;
    l.weight = expert_slice(all.weight, e);
    l.affine = {expert_slice(all.affine.scales, e), expert_slice(all.affine.biases, e), all.affine.bits,
                all.affine.group_size};
  }
  return experts;
}

void bind_attention(const ModelSpec& s, const ArchTable& arch, const Binder& b, LayerWeights& w) {
  const int64_t h = s.hidden_size, q = s.q_size(), kv = s.kv_size();
  if (b.has_linear("self_attn.qkv_proj")) {
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
  if (b.has_linear("mlp.gate_up_proj")) {
    w.gate_up = b.linear("mlp.gate_up_proj", 2 * inter, h);
  } else {
    w.gate = b.linear("mlp.gate_proj", inter, h);
    w.up = b.linear("mlp.up_proj", inter, h);
  }
  w.down = b.linear("mlp.down_proj", h, inter);
}

// The router and the experts, in any of their layouts: MLX's stacked switch_mlp (dense or
// affine), transformers 5's stacked experts.gate_up_proj / down_proj, or one module per
// expert (dense, MLX affine, AWQ/GPTQ repacked, FP8 widened: as bind_linear takes them).
void bind_experts(const ModelSpec& s, const ArchTable& arch, const Binder& b, LayerWeights& w) {
  const int64_t h = s.hidden_size, inter = s.expert_intermediate_size, n = s.n_experts;
  const std::string block = std::string(arch.moe_block) + ".";
  w.router = b.unbiased(block + "gate", n, h);
  w.experts.resize(static_cast<size_t>(n));
  if (b.has_linear(block + "switch_mlp.gate_proj")) {  // mlx-lm's layout
    const std::vector<Linear> gate = b.stacked(block + "switch_mlp.gate_proj", n, inter, h);
    const std::vector<Linear> up = b.stacked(block + "switch_mlp.up_proj", n, inter, h);
    const std::vector<Linear> down = b.stacked(block + "switch_mlp.down_proj", n, h, inter);
    for (size_t e = 0; e < static_cast<size_t>(n); ++e) w.experts[e] = {gate[e], up[e], down[e]};
    return;
  }
  if (b.has(block + "experts.gate_up_proj")) {  // transformers 5 stacked layout
    Tensor gate_up = b.need(block + "experts.gate_up_proj", {n, 2 * inter, h});
    Tensor down = b.need(block + "experts.down_proj", {n, h, inter});
    for (int64_t e = 0; e < n; ++e) {
      Tensor both = expert_slice(gate_up, e);
      ExpertWeights& ex = w.experts[static_cast<size_t>(e)];
      ex.gate.weight = both.rows(0, inter);
      ex.up.weight = both.rows(inter, inter);
      ex.down.weight = expert_slice(down, e);
    }
    return;
  }
  for (int64_t e = 0; e < n; ++e) {
    const std::string p = fmt::format("{}experts.{}.", block, e);
    w.experts[static_cast<size_t>(e)] = {b.unbiased(p + std::string(arch.expert_gate), inter, h),
                                         b.unbiased(p + std::string(arch.expert_up), inter, h),
                                         b.unbiased(p + std::string(arch.expert_down), h, inter)};
  }
}

}  // namespace

std::string decoder_prefix(const WeightStore& store) {
  return store.contains("embed_tokens.weight") && !store.contains("model.embed_tokens.weight") ? "" : "model.";
}

ModelWeights bind_weights(const ModelSpec& s, const WeightStore& store) {
  const ArchTable& arch = arch_table(s.model_type, store.folder());
  const std::string prefix = decoder_prefix(store);
  ModelWeights w;
  w.embed = bind_linear(store, s.quant, prefix + "embed_tokens", s.vocab_size, s.hidden_size);
  w.final_norm = store.get(prefix + "norm.weight", {s.hidden_size});
  // Tied: the embedding table itself; else lm_head.weight (its absence an error naming it).
  // An embedding model's output is its hidden states: any lm_head is not read.
  if (!s.hidden_output)
    w.lm_head = s.tie_word_embeddings ? w.embed : bind_linear(store, s.quant, "lm_head", s.vocab_size, s.hidden_size);

  w.layers.resize(static_cast<size_t>(s.n_layers));
  for (int64_t i = 0; i < s.n_layers; ++i) {
    Binder b(store, s.quant, prefix, i);
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
