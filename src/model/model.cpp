// Model loading: config → spec, safetensors → store, names → slots.
#include "model/model.h"

#include <nlohmann/json.hpp>

#include <set>

#include "model/config.h"
#include "util/error.h"

namespace kettle {

Model load_model(const std::string& folder) {
  Model model;
  model.source = folder;
  try {
    model.spec = load_model_config(folder);
    model.generation = load_generation_defaults(folder);
    model.embedding = load_embedding_spec(folder);
    model.spec.hidden_output = model.embedding.has_value();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{}/config.json: unexpected value ({})", folder, e.what());
  }
  model.store = std::make_shared<WeightStore>(WeightStore::open_folder(folder));
  model.weights = bind_weights(model.spec, *model.store);
  return model;
}

size_t Model::weight_bytes() const { return weight_bytes_read(false); }

size_t Model::decode_bytes_per_token() const { return weight_bytes_read(true); }

// All weights (tied tensors once), or with `routed_share` what one token's forward reads of
// them: a MoE layer's experts counted at top_k / n_experts of their bytes, the embedding
// table not at all.
size_t Model::weight_bytes_read(bool routed_share) const {
  std::set<const void*> seen;
  size_t total = 0;
  auto count = [&](const Tensor& t) {
    if (!t.empty() && seen.insert(t.data).second) total += t.nbytes();
  };
  auto count_linear = [&](const Linear& l) {
    for (const Tensor* t : {&l.weight, &l.bias, &l.affine.scales, &l.affine.biases, &l.fp8.scales}) count(*t);
  };
  count_linear(weights.lm_head);
  if (!routed_share) count_linear(weights.embed);  // a token's forward reads one row of it
  count(weights.final_norm);
  for (const auto& l : weights.layers) {
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.qkv, &l.o, &l.gate, &l.up, &l.gate_up, &l.down}) count_linear(*p);
    for (const Tensor* t : {&l.attn_norm, &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.ffn_norm, &l.ffn_post_norm})
      count(*t);
    count_linear(l.router);
    const size_t before = total;
    for (const auto& e : l.experts)
      for (const Linear* p : {&e.gate, &e.up, &e.down}) count_linear(*p);
    if (routed_share && !l.experts.empty() && spec.experts_per_token > 0)
      total = before + (total - before) * static_cast<size_t>(spec.experts_per_token) / l.experts.size();
  }
  return total;
}

}  // namespace kettle
