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

// The sampling fields OpenAI routes share (temperature … xtc_*, logit_bias, seed) into
// p.sampling, starting from ctx.sampling.
void parse_openai_sampling(const nlohmann::ordered_json& body, const RequestContext& ctx, CompletionParams& p);

// reasoning_effort's rule (none/minimal: thinking off; low … xhigh: on) for a value found
// at `name`, consistent with what p.thinking already says.
void apply_reasoning_effort(const std::string& effort, const char* name, CompletionParams& p);

// {"error": {...}} with the OpenAI error type for the status.
std::string openai_error_body(const ApiError& error);

struct ResponseMeta {
  std::string id;  // chatcmpl-… / cmpl-…
  int64_t created = 0;
  std::string model;
};

std::unique_ptr<ResponseWriter> make_openai_writer(ResponseMeta meta, const CompletionParams& params);

// The model list of GET /v1/models.
// What /v1/models and /v1/models/{id} tell of the served model beyond OpenAI's four fields.
// A quantized checkpoint's scheme as /v1/models reports it: the mode ("affine" for MLX's
// layout, "awq", "gptq", "fp8"), the default bits, and the group size (affine, AWQ, GPTQ)
// or the FP8 scales' block ({0, 0}: a scale per row or per tensor).
struct QuantSummary {
  std::string mode;
  int bits = 0;  // 0: float weights
  int group_size = 0;
  int block[2] = {0, 0};
};

struct ModelCard {
  std::string id;
  int64_t context_length = 0;
  size_t weight_bytes = 0;
  QuantSummary quantization;
  std::vector<std::string> capabilities;  // "completion", "chat", "tools", "thinking"
  SamplingParams defaults;                // what a request that sets no sampling field gets
  int64_t default_max_tokens = 0;
};
nlohmann::ordered_json openai_model(const ModelCard& card);
nlohmann::ordered_json openai_model_list(const ModelCard& card);

}  // namespace kettle::server
