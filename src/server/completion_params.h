// CompletionParams: one generation request as every API describes it once
// parsed (OpenAI chat and completions, Anthropic messages), before the prompt
// is rendered and tokenized. The protocol parsers fill it; the handler turns it
// into a GenerationRequest for the engine.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace kettle::server {

// What a parser needs to know about the server to check a request.
struct RequestContext {
  std::string model_id;     // the one model served; "default" is also accepted
  int64_t vocab_size = 0;   // bounds logit_bias token ids
  SamplingParams sampling;  // defaults for unset sampling fields (from flags and generation_config.json)
};

struct CompletionParams {
  bool chat = true;
  nlohmann::ordered_json messages;  // chat: messages in the shape chat templates expect (HF / OpenAI)
  nlohmann::ordered_json tools;     // chat: OpenAI-shaped tool list for the template, or null
  nlohmann::ordered_json template_vars = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::optional<bool> thinking;     // the request's enable_thinking, when it says
  std::string prompt;               // completions: the prompt text
  std::optional<int64_t> max_tokens;
  SamplingParams sampling;          // warpers, penalties, logit_bias, logprobs
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;          // vLLM's extension: keep going past end-of-sequence ids
  std::string cache_salt;           // vLLM's extension: prefix-cache sharing only with the same salt
};

}  // namespace kettle::server
