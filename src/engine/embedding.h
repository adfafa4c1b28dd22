// Embeddings as a client asks for them: the text an input becomes (the model's
// instruction prompt before it), the engine request that pools its hidden
// states, and `dimensions` (truncate, then renormalize) where the model is
// Matryoshka-trained. The server's /v1/embeddings and `kettle embed` share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/embedding_spec.h"

namespace kettle {

struct Model;

struct EmbeddingModel {
  EmbeddingSpec spec;
  int64_t hidden_size = 0;
  int64_t context = 0;  // the most tokens one input may have (max_seq_length, else the model's context)
};

// What an embedding model's folder says; an error when `model` is a language model.
EmbeddingModel embedding_model(const Model& model);

// The text put before every input: the named prompt, else the model's default one ("" when it
// has none). An unknown name is an error that lists the model's prompts.
std::string embedding_prompt(const EmbeddingModel& model, const std::string& prompt_name);

// The engine request for one tokenized input (at most model.context tokens: else an error
// naming the input's index and length).
GenerationRequest embedding_request(const EmbeddingModel& model, std::vector<int32_t> ids, size_t index);

// Checks a requested `dimensions` against the model (0: the full vector); errors name it.
void check_dimensions(const EmbeddingModel& model, int64_t dimensions);

// The first `dimensions` values scaled to unit length (0 or the full width: unchanged).
std::vector<float> truncate_embedding(std::vector<float> embedding, int64_t dimensions);

}  // namespace kettle
