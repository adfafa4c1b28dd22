// The OpenAI wire format: request bodies of /v1/chat/completions and
// /v1/completions checked field by field into CompletionParams, and responses,
// stream chunks and errors ({"error": {message, type, param, code}}) written
// as the OpenAI API reference shows them — plus vLLM's `reasoning_content`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "server/completion_params.h"
#include "server/response_writer.h"

namespace kettle::server {

// Checks a (chat) completion request; unset sampling fields take ctx.sampling;
// an unknown model name throws 404, any malformed field 400 naming it.
CompletionParams parse_openai_request(const nlohmann::ordered_json& body, bool chat, const RequestContext& ctx);

// {"error": {...}} with the OpenAI error type for the status.
std::string openai_error_body(const ApiError& error);

struct ResponseMeta {
  std::string id;  // chatcmpl-… / cmpl-…
  int64_t created = 0;
  std::string model;
};

std::unique_ptr<ResponseWriter> make_openai_writer(ResponseMeta meta, const CompletionParams& params);

// The model list of GET /v1/models.
nlohmann::ordered_json openai_model_list(const std::string& model_id, int64_t created);

}  // namespace kettle::server
