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

// What the output must look like (output_constraint.h), as the request asked.
struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar, kToolCall };
  Kind kind = Kind::kNone;
  std::string field;                 // the request field it came from, for errors
  nlohmann::ordered_json schema;     // kJsonSchema
  std::string text;                  // kRegex, kGrammar (GBNF)
  std::vector<std::string> choices;  // kChoice
  std::string tool;                  // kToolCall: the function that must be called ("" any)

  static OutputConstraint of(Kind kind, std::string field) {
    OutputConstraint c;
    c.kind = kind;
    c.field = std::move(field);
    return c;
  }
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
  OutputConstraint constraint;      // constrained decoding, when asked
};

}  // namespace kettle::server
