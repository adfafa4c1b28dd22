// TurnBuilder: the engine's text events of one generation → TurnDeltas, by
// running the model's output through the reasoning / tool-call parser
// (chat/output_parser.h) and naming each tool call; at the end, the
// TurnEnd with the finish reason the APIs report ("tool_calls" when the
// turn ended in tool calls).
#pragma once

#include <random>
#include <string>

#include "chat/output_parser.h"
#include "server/request_channel.h"
#include "server/turn.h"

namespace kettle::server {

class TurnBuilder {
 public:
  // id_prefix: "call_" (OpenAI) or "toolu_" (Anthropic).
  TurnBuilder(const OutputParserOptions& options, std::string id_prefix);

  TurnDelta push(Event& text_event);  // takes the event's text and logprobs
  TurnDelta finish();                 // what the parser still held
  TurnEnd end(const Event& done) const;

 private:
  void add(std::vector<OutputEvent> events, TurnDelta& delta);

  OutputParser parser_;
  std::string id_prefix_;
  std::mt19937_64 rng_;
  bool called_tools_ = false;
};

}  // namespace kettle::server
