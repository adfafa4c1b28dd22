// The OpenAI wire format: request bodies of /v1/chat/completions and
// /v1/completions checked field by field into CompletionParams, and the JSON of
// responses, stream chunks and errors ({"error": {message, type, param, code}}).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace kettle::server {

// An error a client caused (or the server hit), carried to the HTTP response.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  std::string type() const;  // invalid_request_error, not_found_error, server_error, ...

 private:
  int status_;
  std::string param_;
  std::string code_;
};

std::string error_body(const ApiError& error);

struct CompletionParams {
  bool chat = true;
  nlohmann::ordered_json messages;  // chat: the messages, content flattened to strings
  std::string prompt;               // completions: the prompt text
  std::optional<int64_t> max_tokens;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;  // vLLM's extension: keep going past end-of-sequence ids
};

// Parses a request body; malformed JSON and bad fields throw ApiError 400.
nlohmann::ordered_json parse_body(const std::string& body);
// Checks the fields of a (chat) completion request; defaults fill unset sampling
// fields; an unknown model name throws 404.
CompletionParams parse_completion_request(const nlohmann::ordered_json& body, bool chat,
                                          const SamplingParams& defaults, const std::string& model_id);

// What every response of one request shares.
struct ResponseMeta {
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
  bool chat = true;
};

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
nlohmann::json full_response(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                             int64_t prompt_tokens, int64_t completion_tokens);
// A stream chunk: role-only first delta (chat), a text piece, or the finish.
nlohmann::json role_chunk(const ResponseMeta& meta);
nlohmann::json text_chunk(const ResponseMeta& meta, const std::string& text);
nlohmann::json finish_chunk(const ResponseMeta& meta, const std::string& finish_reason);
nlohmann::json usage_chunk(const ResponseMeta& meta, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace kettle::server
