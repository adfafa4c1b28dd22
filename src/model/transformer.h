// Transformer: the one generic decoder forward every family runs, reading
// its differences from ModelSpec and its tensors from ModelWeights.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/rope_config.h"
#include "tensor/host_buffer.h"

namespace kettle {

enum class LogitsFor { kLastToken, kAllTokens };

class Transformer {
 public:
  Transformer(const Model& model, Backend& backend);

  const ModelSpec& spec() const { return model_.spec; }
  KvCache new_cache() const { return KvCache(model_.spec.n_layers, model_.spec.kv_size()); }

  // Runs tokens[0, n) at positions [kv.length(), kv.length() + n), appends their keys and
  // values to kv, and writes logits: [1, vocab] for the last token or [n, vocab] for all.
  void forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits);

 private:
  void attention_block(int64_t layer, int64_t n, KvCache& kv);
  void mlp_block(int64_t layer, int64_t n);
  void ensure_scratch(int64_t n);
  const RopeTable& rope_table(int index, int64_t seq_len);

  const Model& model_;
  Backend& backend_;
  std::vector<RopeTable> ropes_;
  std::vector<int64_t> rope_len_;  // the seq_len each table was computed for (length-dependent types)
  std::vector<int32_t> positions_;
  int64_t scratch_tokens_ = 0;
  HostBuffer<float> hidden_;   // [n, hidden] the residual stream
  HostBuffer<float> normed_;   // [n, hidden]
  HostBuffer<float> q_;        // [n, q_size]
  HostBuffer<float> qkv_;      // [n, q_size + 2 kv_size] (fused projections only)
  HostBuffer<float> attn_;     // [n, q_size]
  HostBuffer<float> proj_;     // [n, hidden]
  HostBuffer<float> mlp_;      // [n, 2 inter]
};

}  // namespace kettle
