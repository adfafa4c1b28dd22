// Shapes follow Anthropic's Messages API reference: request fields, content
// blocks, stop reasons (end_turn, max_tokens, stop_sequence, tool_use) and the
// streaming events. Field errors name the field as OpenAI-side errors do.
#include "server/anthropic_protocol.h"

#include <fmt/format.h>

#include <random>

#include "server/output_constraint.h"
#include "server/request_fields.h"
#include "server/request_schema.h"

namespace kettle::server {
namespace {

using json = nlohmann::ordered_json;  // keys in the order the API reference shows them

std::string text_of_blocks(const ordered_json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(name, "a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& block = content[i];
    if (!field_is(block, "type", "text") || !block.contains("text") || !block["text"].is_string())
      bad_field(fmt::format("{}[{}]", name, i), "a {\"type\": \"text\", \"text\": ...} block");
    text += block["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message → the template's messages: tool results become "tool" messages
// (before the user's text, as Anthropic puts them first), tool_use blocks become
// tool_calls with object arguments, thinking blocks become reasoning_content.
void convert_message(const ordered_json& m, const std::string& name, ordered_json& out) {
  if (!m.is_object()) bad_field(name, "an object");
  const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
  if (role != "user" && role != "assistant") bad_field(name + ".role", "\"user\" or \"assistant\"");
  if (!m.contains("content")) throw ApiError(400, fmt::format("'{}.content' is required", name), name + ".content");
  const ordered_json& content = m["content"];
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content.get<std::string>()}});
    return;
  }
  if (!content.is_array()) bad_field(name + ".content", "a string or an array of content blocks");
  std::string text, reasoning;
  ordered_json tool_calls = ordered_json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& block = content[i];
    const std::string block_name = fmt::format("{}.content[{}]", name, i);
    if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
      bad_field(block_name, "a content block with a 'type'");
    const std::string type = block["type"].get<std::string>();
    if (type == "text") {
      if (!block.contains("text") || !block["text"].is_string()) bad_field(block_name + ".text", "a string");
      text += block["text"].get<std::string>();
    } else if (type == "thinking" && role == "assistant") {
      if (block.contains("thinking") && block["thinking"].is_string()) reasoning += block["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      // opaque to kettle: nothing to show the template
    } else if (type == "tool_use" && role == "assistant") {
      if (!block.contains("id") || !block["id"].is_string()) bad_field(block_name + ".id", "a string");
      if (!block.contains("name") || !block["name"].is_string()) bad_field(block_name + ".name", "a string");
      ordered_json input = block.contains("input") ? block["input"] : ordered_json::object();
      if (!input.is_object()) bad_field(block_name + ".input", "an object");
      tool_calls.push_back({{"id", block["id"]},
                            {"type", "function"},
                            {"function", {{"name", block["name"]}, {"arguments", input}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!block.contains("tool_use_id") || !block["tool_use_id"].is_string())
        bad_field(block_name + ".tool_use_id", "a string");
      std::string result = block.contains("content") && !block["content"].is_null()
                               ? text_of_blocks(block["content"], block_name + ".content")
                               : "";
      out.push_back({{"role", "tool"}, {"tool_call_id", block["tool_use_id"]}, {"content", result}});
    } else {
      throw ApiError(400, fmt::format("'{}' is a '{}' block, which kettle does not take in a {} message", block_name,
                                      type, role),
                     block_name);
    }
  }
  if (text.empty() && tool_calls.empty() && reasoning.empty()) return;  // only tool results
  ordered_json message = {{"role", role}, {"content", text}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
  out.push_back(std::move(message));
}

ordered_json convert_tools(const ordered_json& body) {
  const ordered_json* tools = field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) bad_field("tools", "an array of {name, description, input_schema}");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const ordered_json& t = (*tools)[i];
    const std::string name = fmt::format("tools[{}]", i);
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) bad_field(name + ".name", "a string");
    ordered_json fn = {{"name", t["name"]}};
    if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
    fn["parameters"] = t.contains("input_schema") ? t["input_schema"] : ordered_json::object();
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  if (out.empty()) return nullptr;
  if (const ordered_json* choice = field(body, "tool_choice"); choice && field_is(*choice, "type", "none"))
    return nullptr;
  return out;
}

// Anthropic's API requires a model; with one model served, any name routes to it and the
// response names the served id.
void check_model(const ordered_json& body, const std::string&) {
  if (!string_field(body, "model")) throw ApiError(400, "'model' is required", "model");
}

}  // namespace

CompletionParams parse_anthropic_request(const ordered_json& body, const RequestContext& ctx) {
  check_fields(body, Route::kAnthropicMessages);
  check_model(body, ctx.model_id);
  CompletionParams p;
  p.chat = true;
  p.max_tokens = int_field(body, "max_tokens", 1);
  if (!p.max_tokens) throw ApiError(400, "'max_tokens' is required", "max_tokens");

  p.messages = ordered_json::array();
  if (const ordered_json* system = field(body, "system"))
    p.messages.push_back({{"role", "system"}, {"content", text_of_blocks(*system, "system")}});
  const ordered_json* messages = field(body, "messages");
  if (!messages) throw ApiError(400, "'messages' is required", "messages");
  if (!messages->is_array() || messages->empty()) bad_field("messages", "a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i)
    convert_message((*messages)[i], fmt::format("messages[{}]", i), p.messages);
  p.tools = convert_tools(body);
  parse_anthropic_tool_choice(body, p.tools, p);

  p.sampling = ctx.sampling;
  if (auto t = number_field(body, "temperature", 0.0, 1.0)) p.sampling.temperature = static_cast<float>(*t);
  if (auto t = number_field(body, "top_p", 0.0, 1.0)) p.sampling.top_p = static_cast<float>(*t);
  if (auto k = int_field(body, "top_k", 0)) p.sampling.top_k = static_cast<int>(std::min<int64_t>(*k, 1 << 30));
  p.sampling.seed = std::random_device{}();
  p.stop = string_list_field(body, "stop_sequences", 64);
  p.stream = bool_field(body, "stream").value_or(false);
  if (const ordered_json* thinking = field(body, "thinking")) {
    if (!thinking->is_object() || !thinking->contains("type") || !(*thinking)["type"].is_string())
      bad_field("thinking", "an object {\"type\": \"enabled\" | \"disabled\"}");
    const std::string type = (*thinking)["type"].get<std::string>();
    if (type != "enabled" && type != "disabled") bad_field("thinking.type", "\"enabled\" or \"disabled\"");
    (void)int_field(*thinking, "budget_tokens", 1);  // checked; the thinking length is not capped yet
    p.thinking = type == "enabled";
  }
  if (const ordered_json* metadata = field(body, "metadata"); metadata && !metadata->is_object())
    bad_field("metadata", "an object");
  (void)string_field(body, "service_tier");
  p.cache_salt = cache_salt_field(body);
  return p;
}

std::string anthropic_error_body(const ApiError& error) {
  const int s = error.status();
  std::string type = s == 404   ? "not_found_error"
                     : s == 401 ? "authentication_error"
                     : s == 403 ? "permission_error"
                     : s == 413 ? "request_too_large"
                     : s == 429 ? "rate_limit_error"
                     : s == 503 ? "overloaded_error"
                     : s >= 500 ? "api_error"
                                : "invalid_request_error";
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);  // a message may quote a client's bytes
}

namespace {

std::string event(const char* name, const json& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, data.dump(-1, ' ', false, json::error_handler_t::replace));
}

json tool_input(const ToolCall& call) {
  json input = json::parse(call.arguments, nullptr, false);
  return input.is_object() ? input : json::object();
}

// As Anthropic counts: input_tokens are the prompt tokens not read from the cache.
json usage(const TurnEnd& end) {
  json out = {{"input_tokens", end.prompt_tokens - end.cached_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", end.cached_tokens},
              {"output_tokens", end.completion_tokens}};
  if (end.speculative) out["speculation"] = speculation_usage(end);
  return out;
}

std::string stop_reason(const TurnEnd& end) {
  if (end.finish_reason == "length") return "max_tokens";
  if (end.finish_reason == "tool_calls") return "tool_use";
  if (!end.stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

json stop_sequence(const TurnEnd& end) {
  return end.stop_sequence.empty() ? json(nullptr) : json(end.stop_sequence);
}

class AnthropicWriter : public ResponseWriter {
 public:
  AnthropicWriter(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

  std::string error_body(const ApiError& error) const override { return anthropic_error_body(error); }

  std::string full_response(const Turn& turn, const TurnEnd& end) override {
    json content = json::array();
    if (!turn.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", turn.reasoning}, {"signature", ""}});
    if (!turn.content.empty()) content.push_back({{"type", "text"}, {"text", turn.content}});
    for (const ToolCall& call : turn.tool_calls)
      content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", tool_input(call)}});
    json out = message(content, stop_reason(end), stop_sequence(end));
    out["usage"] = usage(end);
    return out.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  std::string stream_start(int64_t prompt_tokens) override {
    json start = message(json::array(), nullptr, nullptr);
    start["usage"] = {{"input_tokens", prompt_tokens}, {"output_tokens", 0}};
    return event("message_start", {{"type", "message_start"}, {"message", start}}) +
           event("ping", {{"type", "ping"}});
  }

  std::string stream_delta(const TurnDelta& delta) override {
    std::string out;
    if (!delta.reasoning.empty())
      out += block_delta(Block::kThinking, {{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
    if (!delta.content.empty()) out += block_delta(Block::kText, {{"type", "text_delta"}, {"text", delta.content}});
    for (const ToolCall& call : delta.tool_calls) {
      out += close_block();
      out += event("content_block_start",
                   {{"type", "content_block_start"},
                    {"index", index_},
                    {"content_block",
                     {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", json::object()}}}});
      out += event("content_block_delta",
                   {{"type", "content_block_delta"},
                    {"index", index_},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", tool_input(call).dump(-1, ' ', false, json::error_handler_t::replace)}}}});
      open_ = Block::kToolUse;
      out += close_block();
    }
    return out;
  }

  std::string stream_finish(const TurnEnd& end) override {
    std::string out = close_block();
    out += event("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", stop_reason(end)}, {"stop_sequence", stop_sequence(end)}}},
                                   {"usage", usage(end)}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  std::string stream_error(const ApiError& error) override {
    return event("error", json::parse(anthropic_error_body(error)));
  }

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };

  json message(json content, json reason, json sequence) const {
    return {{"id", id_},          {"type", "message"},           {"role", "assistant"},
            {"model", model_},    {"content", std::move(content)}, {"stop_reason", std::move(reason)},
            {"stop_sequence", std::move(sequence)}};
  }

  // Opens a block of `kind` unless one is open, then writes the delta into it.
  std::string block_delta(Block kind, json delta) {
    std::string out;
    if (open_ != kind) {
      out += close_block();
      json block = kind == Block::kThinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                            : json{{"type", "text"}, {"text", ""}};
      out += event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
      open_ = kind;
    }
    return out + event("content_block_delta",
                       {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  }

  std::string close_block() {
    if (open_ == Block::kNone) return "";
    std::string out = event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::kNone;
    ++index_;
    return out;
  }

  std::string id_;
  std::string model_;
  Block open_ = Block::kNone;
  int index_ = 0;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_anthropic_writer(std::string id, std::string model) {
  return std::make_unique<AnthropicWriter>(std::move(id), std::move(model));
}

}  // namespace kettle::server
