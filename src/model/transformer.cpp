// The generic decoder forward (pre-norm residual blocks):
//   h = embed(tokens) · embed_scale
//   per layer: h += [post_norm](attn(norm(h)));  h += [post_norm](mlp(norm(h)))
//   logits = [softcap](norm(h) · lm_headᵀ)
// Keys and values are written straight into the cache rows they belong to.
#include "model/transformer.h"

#include <algorithm>

namespace kettle {
namespace {

// Optional weights (biases) are empty tensors; ops take them as nullable pointers.
const Tensor* optional(const Tensor& t) { return t.empty() ? nullptr : &t; }

}  // namespace

Transformer::Transformer(const Model& model, Backend& backend) : model_(model), backend_(backend) {
  for (size_t i = 0; i < model.spec.ropes.size(); ++i) {
    ropes_.push_back(compute_rope_table(model.spec.ropes[i], model.spec.head_dim, model.spec.max_position_embeddings, 0,
                                        model.spec.rope_freq_dtype));
    rope_len_.push_back(0);
  }
}

const RopeTable& Transformer::rope_table(int index, int64_t seq_len) {
  const RopeSpec& spec = model_.spec.ropes[static_cast<size_t>(index)];
  auto i = static_cast<size_t>(index);
  if (rope_depends_on_length(spec) && rope_len_[i] != seq_len) {
    ropes_[i] = compute_rope_table(spec, model_.spec.head_dim, model_.spec.max_position_embeddings, seq_len,
                                   model_.spec.rope_freq_dtype);
    rope_len_[i] = seq_len;
  }
  return ropes_[i];
}

void Transformer::ensure_scratch(int64_t n) {
  if (n <= scratch_tokens_) return;
  const ModelSpec& s = model_.spec;
  const auto count = [n](int64_t width) { return static_cast<size_t>(n * width); };
  int64_t inter = std::max(s.intermediate_size, s.expert_intermediate_size);
  hidden_.resize(count(s.hidden_size));
  normed_.resize(count(s.hidden_size));
  q_.resize(count(s.q_size()));
  qkv_.resize(count(s.q_size() + 2 * s.kv_size()));
  attn_.resize(count(s.q_size()));
  proj_.resize(count(s.hidden_size));
  mlp_.resize(count(2 * inter));
  scratch_tokens_ = n;
}

void Transformer::forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) {
  const ModelSpec& s = model_.spec;
  const ModelWeights& w = model_.weights;
  ensure_scratch(n);
  kv.reserve(kv.length() + n);
  positions_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions_[static_cast<size_t>(t)] = static_cast<int32_t>(kv.length() + t);

  backend_.embed(tokens, n, w.embed, s.embed_scale, hidden_.data());
  for (int64_t layer = 0; layer < s.n_layers; ++layer) {
    attention_block(layer, n, kv);
    mlp_block(layer, n);
  }
  kv.set_length(kv.length() + n);

  const int64_t first = which == LogitsFor::kAllTokens ? 0 : n - 1;
  const int64_t rows = n - first;
  const int64_t h = s.hidden_size;
  backend_.rms_norm(hidden_.data() + first * h, rows, h, h, w.final_norm, s.rms_norm_eps, s.norm_add_one,
                    normed_.data(), h);
  backend_.matmul(normed_.data(), rows, h, w.lm_head, nullptr, logits, s.vocab_size);
  if (s.final_softcap > 0.0f) backend_.softcap(logits, rows * s.vocab_size, s.final_softcap);
}

void Transformer::attention_block(int64_t layer, int64_t n, KvCache& kv) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& w = model_.weights.layers[static_cast<size_t>(layer)];
  const LayerSpec& ls = s.layers[static_cast<size_t>(layer)];
  const int64_t h = s.hidden_size, qs = s.q_size(), kvs = s.kv_size();
  const int64_t start = kv.length();
  float* k_rows = kv.keys(layer) + start * kvs;    // [n, kv_size] inside the cache
  float* v_rows = kv.values(layer) + start * kvs;  // [n, kv_size]

  backend_.rms_norm(hidden_.data(), n, h, h, w.attn_norm, s.rms_norm_eps, s.norm_add_one, normed_.data(), h);
  if (!w.qkv.empty()) {
    const int64_t width = qs + 2 * kvs;
    backend_.matmul(normed_.data(), n, h, w.qkv, optional(w.qkv_bias), qkv_.data(), width);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv_.data() + t * width;
      std::copy_n(row, qs, q_.data() + t * qs);
      std::copy_n(row + qs, kvs, k_rows + t * kvs);
      std::copy_n(row + qs + kvs, kvs, v_rows + t * kvs);
    }
  } else {
    const MatmulTarget qkv[] = {{&w.q, optional(w.q_bias), q_.data(), qs},
                                         {&w.k, optional(w.k_bias), k_rows, kvs},
                                         {&w.v, optional(w.v_bias), v_rows, kvs}};
    backend_.matmul_many(normed_.data(), n, h, qkv, 3);
  }
  if (!w.q_norm.empty())
    backend_.rms_norm(q_.data(), n * s.n_heads, s.head_dim, s.head_dim, w.q_norm, s.rms_norm_eps, s.norm_add_one,
                      q_.data(), s.head_dim);
  if (!w.k_norm.empty())
    backend_.rms_norm(k_rows, n * s.n_kv_heads, s.head_dim, s.head_dim, w.k_norm, s.rms_norm_eps, s.norm_add_one,
                      k_rows, s.head_dim);

  const RopeTable& table = rope_table(ls.rope, start + n);
  RopeParams rope{table.inv_freq.data(), table.rotary_dim, table.attention_factor};
  backend_.rope(q_.data(), n, qs, s.n_heads, s.head_dim, positions_.data(), rope);
  backend_.rope(k_rows, n, kvs, s.n_kv_heads, s.head_dim, positions_.data(), rope);

  AttentionParams params{s.n_heads, s.n_kv_heads, s.head_dim, s.attn_scale, s.attn_softcap, ls.sliding_window};
  backend_.attention(q_.data(), n, qs, kv.keys(layer), kv.values(layer), kvs, start, params, attn_.data(), qs);
  backend_.matmul(attn_.data(), n, qs, w.o, optional(w.o_bias), proj_.data(), h);
  if (!w.attn_post_norm.empty())
    backend_.rms_norm(proj_.data(), n, h, h, w.attn_post_norm, s.rms_norm_eps, s.norm_add_one, proj_.data(), h);
  backend_.add(hidden_.data(), proj_.data(), n * h);
}

void Transformer::mlp_block(int64_t layer, int64_t n) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& w = model_.weights.layers[static_cast<size_t>(layer)];
  const int64_t h = s.hidden_size;

  backend_.rms_norm(hidden_.data(), n, h, h, w.ffn_norm, s.rms_norm_eps, s.norm_add_one, normed_.data(), h);
  if (s.layers[static_cast<size_t>(layer)].moe) {
    MoeParams params{s.experts_per_token, s.norm_topk_prob, s.act};
    backend_.moe(normed_.data(), n, h, w.router, w.experts, params, proj_.data());
  } else {
    const int64_t inter = s.intermediate_size, width = 2 * inter;  // mlp_ rows: [gate | up]
    if (!w.gate_up.empty()) {
      backend_.matmul(normed_.data(), n, h, w.gate_up, nullptr, mlp_.data(), width);
    } else {
      const MatmulTarget gate_up[] = {{&w.gate, optional(w.gate_bias), mlp_.data(), width},
                                               {&w.up, optional(w.up_bias), mlp_.data() + inter, width}};
      backend_.matmul_many(normed_.data(), n, h, gate_up, 2);
    }
    backend_.gated_activation(mlp_.data(), mlp_.data() + inter, n, inter, width, s.act, mlp_.data(), width);
    backend_.matmul(mlp_.data(), n, width, w.down, optional(w.down_bias), proj_.data(), h);
  }
  if (!w.ffn_post_norm.empty())
    backend_.rms_norm(proj_.data(), n, h, h, w.ffn_post_norm, s.rms_norm_eps, s.norm_add_one, proj_.data(), h);
  backend_.add(hidden_.data(), proj_.data(), n * h);
}

}  // namespace kettle
