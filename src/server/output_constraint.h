// What a request asks its output to look like (constrained decoding), read from
// each API's fields, and the grammar that holds a model's output to it:
//   - OpenAI response_format json_object / json_schema, the Responses API's
//     text.format, vLLM's guided_json / guided_regex / guided_choice / guided_grammar;
//   - a call forced by tool_choice (OpenAI "required" or a named function, Anthropic
//     any / tool), in the model's own tool-call syntax, each call's arguments held to
//     its tool's parameter schema.
// A model that thinks first (<think>…</think>) may think freely; the grammar holds
// what comes after. One constraint per request: a second is refused naming both.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "chat/output_parser.h"
#include "server/completion_params.h"

namespace kettle::server {

// OpenAI chat and completions: response_format and vLLM's guided_* fields.
void parse_openai_constraint(const nlohmann::ordered_json& body, CompletionParams& p);
// OpenAI tool_choice ("none", "auto", "required", a named function — the chat shape
// {"type": "function", "function": {"name"}} or the Responses shape {"type": "function",
// "name"}), checked against `tools` (OpenAI-shaped, or null).
void parse_openai_tool_choice(const nlohmann::ordered_json& body, const nlohmann::ordered_json& tools,
                              CompletionParams& p);
// The Responses API's text.format: {"type": "text" | "json_object" | "json_schema", …}.
void parse_responses_text_format(const nlohmann::ordered_json& format, CompletionParams& p);
// Anthropic tool_choice: {"type": "auto" | "any" | "tool" (with "name") | "none"}.
void parse_anthropic_tool_choice(const nlohmann::ordered_json& body, const nlohmann::ordered_json& tools,
                                 CompletionParams& p);

// The constraint's grammar (GBNF, start rule kConstraintRoot) for a model whose output
// reads as `parse` says. Throws ApiError (400) naming the request field when it cannot be
// made (a tool-call syntax the model lacks, a schema keyword not supported, …).
inline constexpr const char* kConstraintRoot = "kettle-root";
std::string constraint_gbnf(const OutputConstraint& constraint, const OutputParserOptions& parse,
                            const nlohmann::ordered_json& tools);

}  // namespace kettle::server
