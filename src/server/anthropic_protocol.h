// The Anthropic Messages wire format (POST /v1/messages): requests checked
// field by field into CompletionParams (content blocks → the messages a chat
// template expects: tool_use → tool_calls, tool_result → "tool" messages,
// system → a system message), and responses written as content blocks
// (thinking, text, tool_use) or as the API's exact event sequence:
// message_start, content_block_start/delta/stop per block, message_delta,
// message_stop (and `error` events).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "server/completion_params.h"
#include "server/response_writer.h"

namespace kettle::server {

CompletionParams parse_anthropic_request(const nlohmann::ordered_json& body, const RequestContext& ctx);

// {"type": "error", "error": {"type": …, "message": …}}
std::string anthropic_error_body(const ApiError& error);

std::unique_ptr<ResponseWriter> make_anthropic_writer(std::string id, std::string model);

}  // namespace kettle::server
