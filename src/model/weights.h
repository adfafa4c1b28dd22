// ModelWeights: the checkpoint's tensors bound to the slots the generic
// forward reads. Optional slots (biases, q/k norms, sandwich norms) are empty
// tensors when the checkpoint has no such tensor.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/model_spec.h"
#include "model/weight_store.h"

namespace kettle {

struct LayerWeights {
  Tensor attn_norm;                            // [hidden]
  Tensor q, k, v;                              // [q_size | kv_size, hidden], or empty when fused
  Tensor qkv;                                  // [q_size + 2 kv_size, hidden] (phi3)
  Tensor q_bias, k_bias, v_bias, qkv_bias, o_bias;
  Tensor o;                                    // [hidden, q_size]
  Tensor q_norm, k_norm;                       // [head_dim]
  Tensor attn_post_norm;                       // [hidden] (sandwich norms)
  Tensor ffn_norm;                             // [hidden]
  Tensor ffn_post_norm;                        // [hidden] (sandwich norms)
  Tensor gate, up;                             // [inter, hidden], or empty when fused
  Tensor gate_up;                              // [2 inter, hidden] (phi3)
  Tensor gate_bias, up_bias, down_bias;
  Tensor down;                                 // [hidden, inter]
  Tensor router;                               // [n_experts, hidden]
  std::vector<ExpertWeights> experts;
};

struct ModelWeights {
  Tensor embed;       // [vocab, hidden]
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;
};

// Binds and shape-checks every tensor the spec needs; errors name the tensor.
ModelWeights bind_weights(const ModelSpec& spec, const WeightStore& store);

}  // namespace kettle
