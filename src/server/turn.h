// A model's turn as the APIs report it: reasoning text, answer text, tool
// calls and per-token log-probabilities, arriving as TurnDeltas while the
// engine streams and summed into a Turn for non-streaming responses.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kettle::server {

struct ToolCall {
  std::string id;         // call_… (OpenAI) / toolu_… (Anthropic)
  std::string name;
  std::string arguments;  // a JSON object, serialized
};

struct TopLogprob {
  int32_t id = 0;
  std::string text;  // the token's own text (its bytes, possibly part of a character)
  float logprob = 0.0f;
};

struct TokenLogprob {
  int32_t id = 0;
  std::string text;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
};

struct TurnDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty() && logprobs.empty(); }
};

struct TurnEnd {
  std::string finish_reason;  // "stop", "length" or "tool_calls"
  std::string stop_sequence;  // the stop string that ended the turn, if one did
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, served from the prefix cache
  bool speculative = false;   // drafted and accepted are reported (--draft-kind)
  int64_t drafted = 0, accepted = 0;
};

// usage's "speculation" member (every API's usage object has it when the server drafts).
inline nlohmann::json speculation_usage(const TurnEnd& end) {
  return {{"drafted", end.drafted}, {"accepted", end.accepted}};
}

struct Turn {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;

  void add(TurnDelta delta) {
    reasoning += delta.reasoning;
    content += delta.content;
    for (ToolCall& call : delta.tool_calls) tool_calls.push_back(std::move(call));
    for (TokenLogprob& lp : delta.logprobs) logprobs.push_back(std::move(lp));
  }
};

}  // namespace kettle::server
