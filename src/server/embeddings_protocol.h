// POST /v1/embeddings as OpenAI defines it: the request's inputs (a string,
// strings, token ids, or lists of token ids; at most 2048), encoding_format
// float or base64, dimensions, and kettle's prompt_name; and the response
// body. The handler (embeddings_handler.cpp) runs the inputs through the engine.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kettle::server {

inline constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingsParams {
  std::vector<std::string> texts;                  // text inputs, or
  std::vector<std::vector<int32_t>> token_inputs;  // pre-tokenized ones
  bool base64 = false;
  int64_t dimensions = 0;  // 0: the model's width
  std::string prompt_name;
  size_t count() const { return texts.empty() ? token_inputs.size() : texts.size(); }
};

// The request's fields (ApiError 400 naming the field on a bad value); token ids must lie
// in [0, vocab_size).
EmbeddingsParams parse_embeddings_request(const nlohmann::ordered_json& body, int64_t vocab_size);

// The response body: one embedding per input in order, as float arrays or base64 of their
// little-endian float32 bytes.
std::string embeddings_response(const std::string& model_id, const std::vector<std::vector<float>>& embeddings,
                                bool base64, int64_t prompt_tokens);

// Standard base64 (RFC 4648, padded) of `bytes`.
std::string base64_encode(const void* bytes, size_t size);

}  // namespace kettle::server
