// Model: a loaded checkpoint — its spec, its tensors (mapped, not copied)
// and the author's generation defaults.
#pragma once

#include <memory>
#include <string>

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

  size_t weight_bytes() const;  // bytes the forward reads per token (tied embeddings counted once)
};

// Loads a Hugging Face model folder; every failure is a kettle::Error naming the file or tensor.
Model load_model(const std::string& folder);

}  // namespace kettle
