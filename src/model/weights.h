// ModelWeights: the checkpoint's tensors bound to the slots the generic
// forward reads. Each projection is a Linear (its weight, its scheme, its
// optional bias: backend/linear.h), bound by one call that checks both shapes.
// Optional slots (biases, q/k norms, sandwich norms) are empty when the
// checkpoint has no such tensor.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/linear.h"
#include "model/model_spec.h"
#include "model/weight_store.h"

namespace kettle {

struct LayerWeights {
  Tensor attn_norm;                            // [hidden]
  Linear q, k, v;                              // [q_size | kv_size, hidden], or empty when fused
  Linear qkv;                                  // [q_size + 2 kv_size, hidden] (phi3)
  Linear o;                                    // [hidden, q_size]
  Tensor q_norm, k_norm;                       // [head_dim]
  Tensor attn_post_norm;                       // [hidden] (sandwich norms)
  Tensor ffn_norm;                             // [hidden]
  Tensor ffn_post_norm;                        // [hidden] (sandwich norms)
  Linear gate, up;                             // [inter, hidden], or empty when fused
  Linear gate_up;                              // [2 inter, hidden] (phi3)
  Linear down;                                 // [hidden, inter]
  Linear router;                               // [n_experts, hidden]
  std::vector<ExpertWeights> experts;
};

struct ModelWeights {
  Linear embed;       // [vocab, hidden] (a table: rows looked up, never multiplied)
  Tensor final_norm;  // [hidden]
  Linear lm_head;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;
};

// Where the checkpoint's decoder tensors sit: "model." for a causal LM; "" for a base model
// (an embedding model saved by sentence-transformers, Qwen3-Embedding) that names them at
// the top level.
std::string decoder_prefix(const WeightStore& store);

// Binds and shape-checks every tensor the spec needs; errors name the tensor.
ModelWeights bind_weights(const ModelSpec& spec, const WeightStore& store);

}  // namespace kettle
