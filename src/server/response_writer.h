// ResponseWriter: how one API writes a generation back — the whole response
// as JSON, or server-sent events (start, deltas, finish) — and its errors.
// One instance per request; implementations in openai_protocol.cpp and
// anthropic_protocol.cpp.
#pragma once

#include <string>

#include "server/api_error.h"
#include "server/turn.h"

namespace kettle::server {

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // The JSON error body for a status (OpenAI {"error": …} or Anthropic {"type": "error", …}).
  virtual std::string error_body(const ApiError& error) const = 0;
  // Non-streaming: the whole response.
  virtual std::string full_response(const Turn& turn, const TurnEnd& end) = 0;
  // Streaming: SSE text to write; start() once the prompt is known, then deltas, then finish() or error().
  virtual std::string stream_start(int64_t prompt_tokens) = 0;
  virtual std::string stream_delta(const TurnDelta& delta) = 0;
  virtual std::string stream_finish(const TurnEnd& end) = 0;
  virtual std::string stream_error(const ApiError& error) = 0;
};

}  // namespace kettle::server
