// Model: a loaded checkpoint — its spec, its tensors (mapped, not copied)
// and the author's generation defaults.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/embedding_spec.h"
#include "model/generation_config.h"
#include "model/model_spec.h"
#include "model/weight_store.h"
#include "model/weights.h"

namespace kettle {

struct Model {
  std::string source;  // folder, or "synthetic:<preset>"
  ModelSpec spec;
  std::shared_ptr<WeightStore> store;
  ModelWeights weights;
  GenerationDefaults generation;
  std::optional<EmbeddingSpec> embedding;  // an embedding model: how it pools (spec.hidden_output)

  size_t weight_bytes() const;  // bytes of all weights (tied embeddings counted once)
  // Bytes one token's forward reads: all weights but, in a MoE layer, only top_k of its
  // n_experts experts' share (the decode step's bandwidth floor).
  size_t decode_bytes_per_token() const;

 private:
  size_t weight_bytes_read(bool routed_share) const;
};

// Loads a Hugging Face model folder; every failure is a kettle::Error naming the file or tensor.
Model load_model(const std::string& folder);

}  // namespace kettle
