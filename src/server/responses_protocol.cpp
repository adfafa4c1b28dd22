#include "server/responses_protocol.h"

#include <fmt/format.h>

#include <random>

#include "server/openai_protocol.h"
#include "server/output_constraint.h"
#include "server/request_fields.h"
#include "server/request_schema.h"

namespace kettle::server {
namespace {

using json = nlohmann::ordered_json;

// Text of a message's content: a string, or input_text / output_text parts.
std::string item_text(const json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(name, "a string or an array of input_text parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string part_name = fmt::format("{}[{}]", name, j);
    if (!field_is(part, "type", "input_text") && !field_is(part, "type", "output_text")) {
      if (part.is_object() && part.contains("type") && part["type"].is_string())
        throw ApiError(400, fmt::format("'{}' is a '{}' part; this model reads text only", part_name,
                                        part["type"].get<std::string>()),
                       part_name);
      bad_field(part_name, "an input_text part");
    }
    if (!part.contains("text") || !part["text"].is_string()) bad_field(part_name + ".text", "a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string required_string(const json& item, const char* key, const std::string& name) {
  if (!item.contains(key) || !item[key].is_string()) bad_field(name + "." + key, "a string");
  return item[key].get<std::string>();
}

// Tool-call arguments as chat templates take them: an object when the string is one.
json template_arguments(const std::string& arguments) {
  json parsed = json::parse(arguments, nullptr, false);
  return parsed.is_object() ? parsed : json(arguments);
}

// The input items after `conversation`, as chat messages: function calls join the
// assistant message right before them (or start one), outputs become tool messages, and
// a reasoning item's text rides on the assistant message that follows it.
void append_input(const json& input, json& conversation) {
  if (input.is_string()) {
    if (input.get<std::string>().empty()) bad_field("input", "a non-empty string or an array of items");
    conversation.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array() || input.empty()) bad_field("input", "a non-empty string or an array of items");
  std::string reasoning;
  bool assistant_last = false;  // the last message is an assistant one of this input: calls join it
  const auto assistant = [&](json message) {
    if (!reasoning.empty()) message["reasoning_content"] = std::exchange(reasoning, "");
    conversation.push_back(std::move(message));
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string name = fmt::format("input[{}]", i);
    if (!item.is_object()) bad_field(name, "an object");
    std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "";
    if (type.empty() && item.contains("role")) type = "message";
    bool assistant_now = false;
    if (type == "message") {
      std::string role = required_string(item, "role", name);
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system")
        bad_field(name + ".role", "\"user\", \"assistant\", \"system\" or \"developer\"");
      if (!item.contains("content")) bad_field(name + ".content", "a string or an array of input_text parts");
      json message = {{"role", role}, {"content", item_text(item["content"], name + ".content")}};
      if (role == "assistant")
        assistant(std::move(message)), assistant_now = true;
      else if (!reasoning.empty())
        bad_field(name, "the assistant message or function call a reasoning item led to");
      else
        conversation.push_back(std::move(message));
    } else if (type == "function_call") {
      json tool_call = {{"id", required_string(item, "call_id", name)},
                        {"type", "function"},
                        {"function",
                         {{"name", required_string(item, "name", name)},
                          {"arguments", template_arguments(required_string(item, "arguments", name))}}}};
      if (assistant_last && reasoning.empty()) {
        json& message = conversation.back();
        if (!message.contains("tool_calls")) message["tool_calls"] = json::array();
        message["tool_calls"].push_back(std::move(tool_call));
      } else {
        assistant({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({std::move(tool_call)})}});
      }
      assistant_now = true;
    } else if (type == "function_call_output") {
      if (!reasoning.empty()) bad_field(name, "the assistant message or function call a reasoning item led to");
      const std::string call_id = required_string(item, "call_id", name);
      if (!item.contains("output")) bad_field(name + ".output", "a string or an array of input_text parts");
      conversation.push_back(
          {{"role", "tool"}, {"tool_call_id", call_id}, {"content", item_text(item["output"], name + ".output")}});
    } else if (type == "reasoning") {
      const json* parts = item.contains("content") && item["content"].is_array() ? &item["content"]
                          : item.contains("summary") && item["summary"].is_array() ? &item["summary"]
                                                                                    : nullptr;
      if (!parts) bad_field(name, "a reasoning item with content or summary parts");
      for (size_t j = 0; j < parts->size(); ++j) {
        const json& part = (*parts)[j];
        if (!part.is_object() || !part.contains("text") || !part["text"].is_string())
          bad_field(fmt::format("{}.content[{}].text", name, j), "a string");
        reasoning += part["text"].get<std::string>();
      }
    } else {
      throw ApiError(400,
                     fmt::format("'{}' is a '{}' item; kettle takes message, function_call, function_call_output "
                                 "and reasoning items",
                                 name, type),
                     name);
    }
    assistant_last = assistant_now;
  }
  if (!reasoning.empty()) bad_field("input", "no reasoning item last (it must lead to an assistant item)");
}

// Responses' flat function tools → the chat shape templates take.
json convert_tools(const json& tools) {
  if (!tools.is_array()) bad_field("tools", "an array of function tools");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string name = fmt::format("tools[{}]", i);
    if (!field_is(t, "type", "function")) {
      if (t.is_object() && t.contains("type") && t["type"].is_string())
        throw ApiError(400, fmt::format("'{}' is a '{}' tool; kettle calls function tools only", name,
                                        t["type"].get<std::string>()),
                       name);
      bad_field(name, "{\"type\": \"function\", \"name\": ...}");
    }
    json fn = {{"name", required_string(t, "name", name)}};
    if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
    fn["parameters"] = t.contains("parameters") && t["parameters"].is_object() ? t["parameters"] : json::object();
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// The fields applied for some values and refused for others.
void check_settings(const json& body, CompletionParams& p, json& echo) {
  if (bool_field(body, "parallel_tool_calls") == false)
    throw ApiError(400, "'parallel_tool_calls': false is not supported: a turn may return several calls",
                   "parallel_tool_calls");
  if (auto truncation = string_field(body, "truncation"); truncation && *truncation != "disabled")
    throw ApiError(400, "'truncation' \"auto\" is not supported: a prompt past the context is a 400", "truncation");
  if (const json* text = field(body, "text")) {
    if (!text->is_object()) bad_field("text", "an object {\"format\": {\"type\": \"text\"}}");
    for (const auto& [key, value] : text->items()) {
      if (key != "format") throw ApiError(400, fmt::format("'text.{}' is not supported", key), "text." + key);
      parse_responses_text_format(value, p);
    }
  }
  json effort = nullptr;
  if (const json* reasoning = field(body, "reasoning")) {
    if (!reasoning->is_object()) bad_field("reasoning", "an object {\"effort\": ...}");
    for (const auto& [key, value] : reasoning->items()) {
      if (value.is_null()) continue;
      if (key != "effort")
        throw ApiError(400, fmt::format("'reasoning.{}' is not supported: the model's reasoning comes back whole", key),
                       "reasoning." + key);
      if (!value.is_string()) bad_field("reasoning.effort", "a string");
      apply_reasoning_effort(value.get<std::string>(), "reasoning.effort", p);
      effort = value;
    }
  }
  echo["reasoning"] = {{"effort", effort}, {"summary", nullptr}};
  if (const json* metadata = field(body, "metadata"); metadata && !metadata->is_object())
    bad_field("metadata", "an object");
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key", "service_tier"}) (void)string_field(body, key);
}

std::string random_hex_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

}  // namespace

ResponsesRequest parse_responses_request(const json& body, const RequestContext& ctx, ResponseStore& store) {
  check_fields(body, Route::kResponses);
  (void)string_field(body, "model");
  ResponsesRequest r;
  CompletionParams& p = r.params;
  p.chat = true;
  r.conversation = json::array();
  if (auto previous = string_field(body, "previous_response_id")) {
    std::optional<ResponseStore::Entry> entry = store.get(*previous);
    if (!entry)
      throw ApiError(404, fmt::format("no stored response '{}' (never stored, deleted, or expired)", *previous),
                     "previous_response_id");
    r.conversation = std::move(entry->conversation);
    r.previous_response_id = *previous;
  }
  const json* input = field(body, "input");
  if (!input) throw ApiError(400, "'input' is required", "input");
  append_input(*input, r.conversation);
  const std::optional<std::string> instructions = string_field(body, "instructions");
  p.messages = json::array();
  if (instructions) p.messages.push_back({{"role", "system"}, {"content", *instructions}});
  for (const json& m : r.conversation) p.messages.push_back(m);

  const json* tools = field(body, "tools");
  p.tools = tools ? convert_tools(*tools) : json(nullptr);
  const json* choice = field(body, "tool_choice");
  if ((choice && *choice == "none") || (p.tools.is_array() && p.tools.empty())) p.tools = nullptr;
  parse_openai_tool_choice(body, p.tools, p);
  r.echo = {{"instructions", instructions ? json(*instructions) : json(nullptr)},
            {"tools", tools ? *tools : json::array()},
            {"tool_choice", choice ? *choice : json("auto")},
            {"metadata", field(body, "metadata") ? body["metadata"] : json::object()},
            {"user", field(body, "user") ? body["user"] : json(nullptr)}};
  check_settings(body, p, r.echo);

  parse_openai_sampling(body, ctx, p);
  p.max_tokens = int_field(body, "max_output_tokens", 1);
  p.stream = bool_field(body, "stream").value_or(false);
  r.store = bool_field(body, "store").value_or(true);
  p.cache_salt = cache_salt_field(body);
  r.echo["temperature"] = p.sampling.temperature;
  r.echo["top_p"] = p.sampling.top_p;
  r.echo["max_output_tokens"] = p.max_tokens ? json(*p.max_tokens) : json(nullptr);
  return r;
}

namespace {

class ResponsesWriter : public ResponseWriter {
 public:
  ResponsesWriter(ResponsesMeta meta, ResponsesRequest request, StoreResponse on_complete)
      : meta_(std::move(meta)), request_(std::move(request)), on_complete_(std::move(on_complete)) {}

  std::string error_body(const ApiError& error) const override { return openai_error_body(error); }

  std::string full_response(const Turn& turn, const TurnEnd& end) override {
    json output = json::array();
    if (!turn.reasoning.empty()) output.push_back(reasoning_item(random_hex_id("rs_"), turn.reasoning));
    if (!turn.content.empty() || turn.tool_calls.empty())
      output.push_back(message_item(random_hex_id("msg_"), turn.content, "completed"));
    for (const ToolCall& call : turn.tool_calls) output.push_back(call_item(random_hex_id("fc_"), call));
    const json response = finished(turn, end, std::move(output));
    return response.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  std::string stream_start(int64_t) override {
    const json response = response_json("in_progress", json::array(), nullptr);
    std::string out = event({{"type", "response.created"}, {"response", response}});
    return out + event({{"type", "response.in_progress"}, {"response", response}});
  }

  std::string stream_delta(const TurnDelta& delta) override {
    turn_.add(delta);
    std::string out;
    if (!delta.reasoning.empty()) {
      out += open(Open::kReasoning);
      open_text_ += delta.reasoning;
      out += event({{"type", "response.reasoning_text.delta"}, {"item_id", open_id_}, {"output_index", output_.size()},
                    {"content_index", 0}, {"delta", delta.reasoning}});
    }
    if (!delta.content.empty()) {
      out += open(Open::kMessage);
      open_text_ += delta.content;
      out += event({{"type", "response.output_text.delta"}, {"item_id", open_id_}, {"output_index", output_.size()},
                    {"content_index", 0}, {"delta", delta.content}, {"logprobs", json::array()}});
    }
    for (const ToolCall& call : delta.tool_calls) {
      out += close();
      const std::string id = random_hex_id("fc_");
      json item = call_item(id, call);
      json added = item;
      added["status"] = "in_progress";
      added["arguments"] = "";
      const size_t index = output_.size();
      out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", added}});
      out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", index},
                    {"delta", call.arguments}});
      out += event({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index},
                    {"name", call.name}, {"arguments", call.arguments}});
      out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
      output_.push_back(std::move(item));
    }
    return out;
  }

  std::string stream_finish(const TurnEnd& end) override {
    std::string out = close();
    if (output_.empty()) {  // nothing generated: still one (empty) message, as the whole response has
      out += open(Open::kMessage);
      out += close();
    }
    const json response = finished(turn_, end, output_);
    const char* type = response["status"] == "completed" ? "response.completed" : "response.incomplete";
    return out + event({{"type", type}, {"response", response}});
  }

  std::string stream_error(const ApiError& error) override {
    return event({{"type", "error"},
                  {"code", error.code().empty() ? json(nullptr) : json(error.code())},
                  {"message", error.what()},
                  {"param", error.param().empty() ? json(nullptr) : json(error.param())}});
  }

 private:
  enum class Open { kNone, kReasoning, kMessage };

  static json reasoning_item(const std::string& id, const std::string& text) {
    return {{"id", id},
            {"type", "reasoning"},
            {"summary", json::array()},
            {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  static json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }
  static json message_item(const std::string& id, const std::string& text, const char* status) {
    return {{"id", id},
            {"type", "message"},
            {"status", status},
            {"role", "assistant"},
            {"content", json::array({text_part(text)})}};
  }
  static json call_item(const std::string& id, const ToolCall& call) {
    return {{"id", id},         {"type", "function_call"}, {"status", "completed"},
            {"call_id", call.id}, {"name", call.name},       {"arguments", call.arguments}};
  }

  // The item being streamed, opened on its first delta: output_item.added, content_part.added.
  std::string open(Open kind) {
    if (open_ == kind) return "";
    std::string out = close();
    open_ = kind;
    open_id_ = random_hex_id(kind == Open::kReasoning ? "rs_" : "msg_");
    open_text_.clear();
    const size_t index = output_.size();
    json item = kind == Open::kReasoning ? json{{"id", open_id_}, {"type", "reasoning"}, {"summary", json::array()}}
                                         : json{{"id", open_id_},
                                                {"type", "message"},
                                                {"status", "in_progress"},
                                                {"role", "assistant"},
                                                {"content", json::array()}};
    const json part = kind == Open::kReasoning ? json{{"type", "reasoning_text"}, {"text", ""}} : text_part("");
    out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
    out += event({{"type", "response.content_part.added"}, {"item_id", open_id_}, {"output_index", index},
                  {"content_index", 0}, {"part", part}});
    return out;
  }

  // The streamed item's done events: text done, content_part.done, output_item.done.
  std::string close() {
    if (open_ == Open::kNone) return "";
    const size_t index = output_.size();
    const bool reasoning = open_ == Open::kReasoning;
    json item = reasoning ? reasoning_item(open_id_, open_text_) : message_item(open_id_, open_text_, "completed");
    std::string out = event({{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                             {"item_id", open_id_},
                             {"output_index", index},
                             {"content_index", 0},
                             {"text", open_text_}});
    out += event({{"type", "response.content_part.done"}, {"item_id", open_id_}, {"output_index", index},
                  {"content_index", 0}, {"part", item["content"][0]}});
    out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
    open_ = Open::kNone;
    return out;
  }

  // The finished Response, stored (with the conversation it ends) when asked.
  json finished(const Turn& turn, const TurnEnd& end, json output) {
    const bool incomplete = end.finish_reason == "length";
    json usage = {{"input_tokens", end.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", end.cached_tokens}}},
                  {"output_tokens", end.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", end.prompt_tokens + end.completion_tokens}};
    if (end.speculative) usage["speculation"] = speculation_usage(end);
    json response = response_json(incomplete ? "incomplete" : "completed", std::move(output), std::move(usage));
    if (incomplete) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
    if (request_.store && on_complete_) {
      json conversation = request_.conversation;
      json message = {{"role", "assistant"}, {"content", turn.content}};
      if (!turn.reasoning.empty()) message["reasoning_content"] = turn.reasoning;
      if (!turn.tool_calls.empty()) {
        message["tool_calls"] = json::array();
        for (const ToolCall& call : turn.tool_calls)
          message["tool_calls"].push_back({{"id", call.id},
                                           {"type", "function"},
                                           {"function", {{"name", call.name}, {"arguments", template_arguments(call.arguments)}}}});
      }
      conversation.push_back(std::move(message));
      on_complete_(response, std::move(conversation));
    }
    return response;
  }

  json response_json(const char* status, json output, json usage) const {
    const json& e = request_.echo;
    return {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", e["instructions"]},
            {"max_output_tokens", e["max_output_tokens"]},
            {"model", meta_.model},
            {"output", std::move(output)},
            {"parallel_tool_calls", true},
            {"previous_response_id",
             request_.previous_response_id.empty() ? json(nullptr) : json(request_.previous_response_id)},
            {"reasoning", e["reasoning"]},
            {"store", request_.store},
            {"temperature", e["temperature"]},
            {"text", {{"format", {{"type", "text"}}}}},
            {"tool_choice", e["tool_choice"]},
            {"tools", e["tools"]},
            {"top_p", e["top_p"]},
            {"truncation", "disabled"},
            {"usage", std::move(usage)},
            {"user", e["user"]},
            {"metadata", e["metadata"]}};
  }

  std::string event(json data) {
    data["sequence_number"] = sequence_++;
    const std::string type = data["type"].get<std::string>();
    return fmt::format("event: {}\ndata: {}\n\n", type, data.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  ResponsesMeta meta_;
  ResponsesRequest request_;
  StoreResponse on_complete_;
  Turn turn_;                   // streaming: the deltas so far
  json output_ = json::array();  // streaming: the items finished so far
  Open open_ = Open::kNone;
  std::string open_id_, open_text_;
  int64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_responses_writer(ResponsesMeta meta, ResponsesRequest request,
                                                      StoreResponse on_complete) {
  return std::make_unique<ResponsesWriter>(std::move(meta), std::move(request), std::move(on_complete));
}

}  // namespace kettle::server
