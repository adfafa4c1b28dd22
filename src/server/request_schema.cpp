#include "server/request_schema.h"

#include <fmt/format.h>

#include <string>

#include "server/api_error.h"

namespace kettle::server {
namespace {

constexpr FieldUse kApplied = FieldUse::kApplied;
constexpr FieldUse kInfo = FieldUse::kInformational;
constexpr FieldUse kRefused = FieldUse::kRefused;

constexpr std::string_view kNoSampler = "kettle's sampler has no such stage";

// The sampling fields and the end-user identifiers both OpenAI-shaped request kinds take.
std::vector<FieldRule> sampling_and_identity() {
  return {
      {"temperature", kApplied, "sampling"},
      {"top_p", kApplied, "sampling"},
      {"top_k", kApplied, "sampling"},
      {"min_p", kApplied, "sampling"},
      {"seed", kApplied, "the sampler's seed"},
      {"presence_penalty", kApplied, "sampling"},
      {"frequency_penalty", kApplied, "sampling"},
      {"repetition_penalty", kApplied, "sampling"},
      {"cache_salt", kApplied, "separates prompt-cache entries"},
      {"user", kInfo, "an end-user identifier"},
      {"safety_identifier", kInfo, "an end-user identifier"},
      {"prompt_cache_key", kInfo, "a cache routing hint (the prompt cache is automatic)"},
  };
}

std::vector<FieldRule> joined(std::vector<FieldRule> a, const std::vector<FieldRule>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<FieldRule> openai_shared() {
  return joined(sampling_and_identity(), {
      {"model", kApplied, "any name routes to the served model; the response names it"},
      {"max_tokens", kApplied, "the cap on generated tokens"},
      {"max_completion_tokens", kApplied, "the cap on generated tokens (overrides max_tokens)"},
      {"n", kApplied, "1 (one choice)"},
      {"logit_bias", kApplied, "added to the logits"},
      {"logprobs", kApplied, "log-probabilities of the drawn tokens"},
      {"stop", kApplied, "stop sequences"},
      {"stream", kApplied, "server-sent events"},
      {"stream_options", kApplied, "include_usage"},
      {"ignore_eos", kApplied, "generation runs past end-of-sequence tokens"},
      {"response_format", kApplied, "text, json_object or json_schema: the output held to it"},
      {"guided_json", kApplied, "vLLM's: the output held to a JSON schema"},
      {"guided_choice", kApplied, "vLLM's: the output is one of these strings"},
      {"guided_regex", kApplied, "vLLM's: the output matches this regular expression"},
      {"guided_grammar", kApplied, "vLLM's: the output follows this GBNF grammar"},
      {"json_schema", kApplied, "llama-server's: the output held to a JSON schema"},
      {"grammar", kApplied, "llama-server's: the output follows this GBNF grammar"},
      {"guided_decoding_backend", kInfo, "kettle has one grammar engine"},
      {"structured_outputs", kRefused, "send response_format or guided_*"},
      {"xtc_probability", kApplied, "XTC: the chance per token of removing the top choices"},
      {"xtc_threshold", kApplied, "XTC: the probability a top choice reaches"},
      {"typical_p", kRefused, kNoSampler, "1"},
      {"mirostat", kRefused, kNoSampler, "0"},
      {"dry_multiplier", kRefused, kNoSampler, "0"},
      {"repetition_context_size", kApplied, "the repetition penalty's window (last N of prompt + output)"},
      {"presence_context_size", kApplied, "the presence penalty's window (last N of the output)"},
      {"frequency_context_size", kApplied, "the frequency penalty's window (last N of the output)"},
      {"repeat_last_n", kRefused, "llama.cpp's one window for all penalties: send *_context_size"},
      {"penalty_last_n", kRefused, "llama.cpp's one window for all penalties: send *_context_size"},
      {"min_tokens", kRefused, "no minimum length is enforced", "0"},
      {"best_of", kRefused, "one completion is generated", "1"},
      {"adapter", kRefused, "adapters are not loaded"},
      {"adapters", kRefused, "adapters are not loaded"},
      {"lora", kRefused, "adapters are not loaded"},
  });
}

std::vector<FieldRule> chat_rules() {
  return joined(openai_shared(), {
      {"messages", kApplied, "the conversation, through the chat template"},
      {"tools", kApplied, "shown to the template; calls are parsed from the output"},
      {"tool_choice", kApplied, "\"none\" hides the tools, \"auto\" shows them, \"required\" or a named function "
                                "forces a call (its arguments held to the tool's schema)"},
      {"parallel_tool_calls", kApplied, "true (several calls may come back); false refused by value"},
      {"top_logprobs", kApplied, "alternatives per token"},
      {"chat_template_kwargs", kApplied, "variables for the chat template"},
      {"reasoning_effort", kApplied, "\"none\"/\"minimal\" turn thinking off, others on"},
      {"store", kApplied, "false (nothing is stored); true refused by value"},
      {"service_tier", kApplied, "\"auto\" or \"default\" (one tier); others refused by value"},
      {"modalities", kApplied, "[\"text\"]; others refused by value"},
      {"metadata", kInfo, "tags"},
      {"audio", kRefused, "kettle generates text only"},
      {"prediction", kRefused, "predicted outputs are not used"},
      {"web_search_options", kRefused, "kettle does not search the web"},
      {"functions", kRefused, "the legacy form: send 'tools'"},
      {"function_call", kRefused, "the legacy form: send 'tool_choice'"},
      {"verbosity", kRefused, "no verbosity control"},
  });
}

std::vector<FieldRule> completion_rules() {
  return joined(openai_shared(), {
      {"prompt", kApplied, "the text to continue"},
      {"echo", kRefused, "the prompt is not echoed back", "false"},
      {"suffix", kRefused, "no insertion after a suffix"},
  });
}

std::vector<FieldRule> anthropic_rules() {
  return {
      {"model", kApplied, "any name routes to the served model; the response names it"},
      {"max_tokens", kApplied, "the cap on generated tokens"},
      {"messages", kApplied, "the conversation, through the chat template"},
      {"system", kApplied, "the system prompt"},
      {"tools", kApplied, "shown to the template; calls are parsed from the output"},
      {"tool_choice", kApplied, "\"auto\" shows the tools, \"none\" hides them, \"any\" or \"tool\" forces a call (its "
                                "input held to the tool's input_schema)"},
      {"temperature", kApplied, "sampling"},
      {"top_p", kApplied, "sampling"},
      {"top_k", kApplied, "sampling"},
      {"stop_sequences", kApplied, "stop sequences"},
      {"stream", kApplied, "server-sent events"},
      {"thinking", kApplied,
       "enabled/disabled turns the template's thinking on or off (budget_tokens is checked, not yet enforced)"},
      {"cache_salt", kApplied, "separates prompt-cache entries"},
      {"metadata", kInfo, "tags (user_id)"},
      {"service_tier", kInfo, "one tier"},
      {"container", kRefused, "no code-execution containers"},
      {"mcp_servers", kRefused, "kettle does not call MCP servers"},
      {"context_management", kRefused, "the context is not edited"},
  };
}

std::vector<FieldRule> responses_rules() {
  return joined(sampling_and_identity(), {
      {"model", kApplied, "any name routes to the served model; the response names it"},
      {"input", kApplied, "a string or items: messages, function calls and their outputs, reasoning"},
      {"instructions", kApplied, "a system message for this response (not carried to the next)"},
      {"previous_response_id", kApplied, "continues a stored response's conversation"},
      {"store", kApplied, "whether the response is kept for previous_response_id and GET"},
      {"tools", kApplied, "function tools, shown to the template; calls come back as function_call items"},
      {"tool_choice", kApplied, "\"auto\", \"none\", \"required\" or a named function (the call forced)"},
      {"parallel_tool_calls", kApplied, "true (several calls may come back); false refused by value"},
      {"max_output_tokens", kApplied, "the cap on generated tokens"},
      {"stream", kApplied, "server-sent events in the Responses API's sequence"},
      {"reasoning", kApplied, "effort: none/minimal turn thinking off, others on; summary refused by value"},
      {"text", kApplied, "format: text, json_object or json_schema (the output held to it)"},
      {"truncation", kApplied, "\"disabled\" (a prompt past the context is a 400); \"auto\" refused by value"},
      {"metadata", kInfo, "tags, returned with the response"},
      {"service_tier", kInfo, "one tier"},
      {"include", kRefused, "no extra output fields are built"},
      {"background", kRefused, "responses run in the foreground", "false"},
      {"max_tool_calls", kRefused, "the number of calls is not capped"},
      {"prompt", kRefused, "no stored prompt templates"},
      {"conversation", kRefused, "use previous_response_id"},
      {"top_logprobs", kRefused, "not reported on this route"},
      {"stream_options", kRefused, "no stream options here"},
  });
}

std::vector<FieldRule> embeddings_rules() {
  return {
      {"input", kApplied, "a string, strings, token ids, or lists of token ids"},
      {"model", kApplied, "any name: the served model answers, and the response names it"},
      {"encoding_format", kApplied, "\"float\" or \"base64\" (little-endian float32)"},
      {"dimensions", kApplied, "truncate and renormalize (Matryoshka models)"},
      {"prompt_name", kApplied, "the model's named prompt put before each input (sentence-transformers)"},
      {"user", kInfo, "an end-user identifier"},
      {"truncate_prompt_tokens", kRefused, "an input past the model's length is a 400, never cut"},
      {"normalize", kRefused, "the model's own Normalize module decides"},
  };
}

const char* route_name(Route route) {
  switch (route) {
    case Route::kChatCompletions:
      return "/v1/chat/completions";
    case Route::kCompletions:
      return "/v1/completions";
    case Route::kAnthropicMessages:
      return "/v1/messages";
    case Route::kResponses:
      return "/v1/responses";
    case Route::kEmbeddings:
      return "/v1/embeddings";
  }
  return "";
}

}  // namespace

const std::vector<FieldRule>& field_rules(Route route) {
  static const std::vector<FieldRule> chat = chat_rules(), completion = completion_rules(),
                                      anthropic = anthropic_rules(), responses = responses_rules(),
                                      embeddings = embeddings_rules();
  switch (route) {
    case Route::kChatCompletions:
      return chat;
    case Route::kCompletions:
      return completion;
    case Route::kAnthropicMessages:
      return anthropic;
    case Route::kResponses:
      return responses;
    case Route::kEmbeddings:
      return embeddings;
  }
  return chat;
}

void check_fields(const nlohmann::ordered_json& body, Route route) {
  const std::vector<FieldRule>& rules = field_rules(route);
  for (const auto& [key, value] : body.items()) {
    if (value.is_null()) continue;  // a JSON null counts as absent, as everywhere
    const FieldRule* rule = nullptr;
    for (const FieldRule& r : rules)
      if (r.name == key) rule = &r;
    if (!rule)
      throw ApiError(400, fmt::format("'{}' is not a field {} takes", key, route_name(route)), key);
    if (rule->use == FieldUse::kRefused && (rule->neutral.empty() || value.dump() != rule->neutral))
      throw ApiError(400, fmt::format("'{}' is not supported: {}", key, rule->note), key);
  }
}

}  // namespace kettle::server
