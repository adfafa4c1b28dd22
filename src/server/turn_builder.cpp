#include "server/turn_builder.h"

#include <fmt/format.h>

namespace kettle::server {

TurnBuilder::TurnBuilder(const OutputParserOptions& options, std::string id_prefix)
    : parser_(options), id_prefix_(std::move(id_prefix)), rng_(std::random_device{}()) {}

void TurnBuilder::add(std::vector<OutputEvent> events, TurnDelta& delta) {
  for (OutputEvent& event : events) {
    if (auto* r = std::get_if<ReasoningDelta>(&event)) {
      delta.reasoning += r->text;
    } else if (auto* c = std::get_if<ContentDelta>(&event)) {
      delta.content += c->text;
    } else if (auto* call = std::get_if<kettle::ToolCall>(&event)) {
      delta.tool_calls.push_back({fmt::format("{}{:016x}", id_prefix_, rng_()), std::move(call->name),
                                  std::move(call->arguments)});
      called_tools_ = true;
    }
  }
}

TurnDelta TurnBuilder::push(Event& text_event) {
  TurnDelta delta;
  add(parser_.push(text_event.text), delta);
  delta.logprobs = std::move(text_event.logprobs);
  return delta;
}

TurnDelta TurnBuilder::finish() {
  TurnDelta delta;
  add(parser_.finish(), delta);
  return delta;
}

TurnEnd TurnBuilder::end(const Event& done) const {
  TurnEnd end;
  end.finish_reason = done.finish_reason;
  if (called_tools_ && done.finish_reason == "stop" && done.stop_sequence.empty()) end.finish_reason = "tool_calls";
  end.stop_sequence = done.stop_sequence;
  end.prompt_tokens = done.prompt_tokens;
  end.completion_tokens = done.completion_tokens;
  end.cached_tokens = done.cached_tokens;
  end.speculative = done.speculative;
  end.drafted = done.drafted;
  end.accepted = done.accepted;
  return end;
}

}  // namespace kettle::server
