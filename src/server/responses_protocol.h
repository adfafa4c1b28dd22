// The OpenAI Responses API (POST /v1/responses): a request's input (a string,
// or items: messages, function calls and their outputs, reasoning) after the
// stored conversation of previous_response_id becomes the chat messages a
// template renders; the writer answers with a Response object or the
// documented event sequence (response.created … response.completed), output
// items reasoning → message → function_call, and hands the finished response
// and its conversation to the store.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "server/completion_params.h"
#include "server/response_store.h"
#include "server/response_writer.h"

namespace kettle::server {

struct ResponsesRequest {
  CompletionParams params;             // chat messages (instructions, history, input) and sampling
  nlohmann::ordered_json conversation;  // history + this input, without instructions: what a stored response continues
  nlohmann::ordered_json echo;          // the settings the Response object repeats (instructions, tools, ...)
  std::string previous_response_id;
  bool store = true;
};

// 400 naming the field for a malformed one; 404 for a previous_response_id not stored
// (or expired).
ResponsesRequest parse_responses_request(const nlohmann::ordered_json& body, const RequestContext& ctx,
                                         ResponseStore& store);

struct ResponsesMeta {
  std::string id;  // resp_…
  int64_t created = 0;
  std::string model;
};

// on_complete gets the finished Response and the conversation ending with its output,
// when the request asked to store it.
using StoreResponse = std::function<void(const nlohmann::ordered_json& response, nlohmann::ordered_json conversation)>;
std::unique_ptr<ResponseWriter> make_responses_writer(ResponsesMeta meta, ResponsesRequest request,
                                                      StoreResponse on_complete);

}  // namespace kettle::server
