// Request checks name the field that is wrong, as OpenAI's API does in
// error.param; response shapes follow the OpenAI API reference for chat
// completions, completions and their stream chunks.
#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <random>

#include "server/output_constraint.h"
#include "server/request_fields.h"
#include "server/request_schema.h"

namespace kettle::server {
namespace {

using json = nlohmann::ordered_json;  // keys in the order the API reference shows them

std::string content_text(const ordered_json& content, const std::string& name) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(name, "a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ordered_json& part = content[i];
    std::string part_name = fmt::format("{}[{}]", name, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad_field(part_name, "an object with a 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      throw ApiError(400, fmt::format("'{}' is a '{}' part; this model reads text only", part_name, type), part_name);
    if (!part.contains("text") || !part["text"].is_string()) bad_field(part_name + ".text", "a string");
    text += part["text"].get<std::string>();
  }
  return text;
}

// Chat templates expect tool-call arguments as an object (they apply tojson); OpenAI
// clients send a JSON string. A string that is not a JSON object stays a string.
ordered_json template_tool_calls(const ordered_json& calls, const std::string& name) {
  if (!calls.is_array()) bad_field(name, "an array");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const ordered_json& call = calls[i];
    std::string call_name = fmt::format("{}[{}]", name, i);
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      bad_field(call_name, "an object with a 'function'");
    ordered_json copy = call;
    const ordered_json& fn = call["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) bad_field(call_name + ".function.name", "a string");
    if (fn.contains("arguments") && fn["arguments"].is_string()) {
      ordered_json parsed = ordered_json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (parsed.is_object()) copy["function"]["arguments"] = std::move(parsed);
    }
    out.push_back(std::move(copy));
  }
  return out;
}

ordered_json check_messages(const ordered_json& body) {
  const ordered_json* messages = field(body, "messages");
  if (!messages) throw ApiError(400, "'messages' is required", "messages");
  if (!messages->is_array() || messages->empty()) bad_field("messages", "a non-empty array");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const ordered_json& m = (*messages)[i];
    std::string name = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_field(name, "an object");
    if (!m.contains("role") || !m["role"].is_string()) bad_field(name + ".role", "a string");
    ordered_json copy = m;  // keeps the client's other keys (name, tool_call_id) for the template
    copy["content"] = content_text(m.value("content", ordered_json()), name + ".content");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null())
      copy["tool_calls"] = template_tool_calls(m["tool_calls"], name + ".tool_calls");
    out.push_back(std::move(copy));
  }
  return out;
}

ordered_json check_tools(const ordered_json& body) {
  const ordered_json* tools = field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) bad_field("tools", "an array of {\"type\": \"function\", \"function\": {...}}");
  for (size_t i = 0; i < tools->size(); ++i) {
    const ordered_json& t = (*tools)[i];
    std::string name = fmt::format("tools[{}]", i);
    if (!field_is(t, "type", "function") || !t.contains("function") || !t["function"].is_object())
      bad_field(name, "{\"type\": \"function\", \"function\": {...}}");
    if (!t["function"].contains("name") || !t["function"]["name"].is_string())
      bad_field(name + ".function.name", "a string");
  }
  if (tools->empty()) return nullptr;
  // tool_choice "none": the model answers in text, so the template is not shown the tools.
  if (const ordered_json* choice = field(body, "tool_choice"); choice && *choice == "none") return nullptr;
  return *tools;
}

// The fields whose every value but one (or a few) is refused: each is applied where it
// asks for what kettle does anyway, and refused by name where it asks for more.
void check_fixed_fields(const ordered_json& body) {
  if (bool_field(body, "parallel_tool_calls") == false)
    throw ApiError(400, "'parallel_tool_calls': false is not supported: a turn may return several calls",
                   "parallel_tool_calls");
  if (bool_field(body, "store") == true)
    throw ApiError(400, "'store': true is not supported: kettle does not store completions", "store");
  if (auto tier = string_field(body, "service_tier"); tier && *tier != "auto" && *tier != "default")
    throw ApiError(400, fmt::format("'service_tier' \"{}\" is not supported: kettle has one tier", *tier),
                   "service_tier");
  if (const ordered_json* modalities = field(body, "modalities")) {
    if (!modalities->is_array()) bad_field("modalities", "an array of strings");
    for (const ordered_json& m : *modalities)
      if (m != "text") throw ApiError(400, "'modalities' other than \"text\" are not supported", "modalities");
  }
  if (const ordered_json* metadata = field(body, "metadata"); metadata && !metadata->is_object())
    bad_field("metadata", "an object");
}

std::vector<std::pair<int32_t, float>> check_logit_bias(const ordered_json& body, int64_t vocab_size) {
  const ordered_json* bias = field(body, "logit_bias");
  if (!bias) return {};
  if (!bias->is_object()) bad_field("logit_bias", "an object of token id → bias");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : bias->items()) {
    std::string name = fmt::format("logit_bias.{}", key);
    char* end = nullptr;
    long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id >= vocab_size)
      throw ApiError(400, fmt::format("'logit_bias' key '{}' is not a token id in [0, {})", key, vocab_size),
                     "logit_bias");
    if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0)
      bad_field(name, "a number between -100 and 100");
    out.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return out;
}

// One model is served: any name a client sends (`gpt-4o`, an alias, the served id) routes
// to it, and the response names the served id, as llama-server does. A name that is not a
// string is refused by name.
void check_model(const ordered_json& body, const std::string&) { (void)string_field(body, "model"); }

void parse_logprobs(const ordered_json& body, bool chat, CompletionParams& p) {
  if (chat) {
    const bool on = bool_field(body, "logprobs").value_or(false);
    std::optional<int64_t> top = int_field(body, "top_logprobs", 0, 20);
    if (top && !on) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    p.sampling.logprobs = on;
    p.sampling.top_logprobs = static_cast<int>(top.value_or(0));
  } else if (const ordered_json* lp = field(body, "logprobs"); lp && lp->is_boolean()) {
    p.sampling.logprobs = lp->get<bool>();  // true, as chat takes it: the drawn tokens', no alternatives
  } else if (auto n = int_field(body, "logprobs", 0, 5)) {
    p.sampling.logprobs = true;
    p.sampling.top_logprobs = static_cast<int>(*n);
  }
}

void parse_template_kwargs(const ordered_json& body, CompletionParams& p) {
  if (const ordered_json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) bad_field("chat_template_kwargs", "an object");
    p.template_vars = *kwargs;
    if (kwargs->contains("enable_thinking")) {
      if (!(*kwargs)["enable_thinking"].is_boolean()) bad_field("chat_template_kwargs.enable_thinking", "a boolean");
      p.thinking = (*kwargs)["enable_thinking"].get<bool>();
    }
  }
}

}  // namespace

void parse_openai_sampling(const ordered_json& body, const RequestContext& ctx, CompletionParams& p) {
  p.sampling = ctx.sampling;
  if (auto t = number_field(body, "temperature", 0.0, 2.0)) p.sampling.temperature = static_cast<float>(*t);
  if (auto t = number_field(body, "top_p", 0.0, 1.0)) p.sampling.top_p = static_cast<float>(*t);
  if (auto k = int_field(body, "top_k", -1)) p.sampling.top_k = static_cast<int>(std::min<int64_t>(*k, 1 << 30));
  if (auto m = number_field(body, "min_p", 0.0, 1.0)) p.sampling.min_p = static_cast<float>(*m);
  if (auto s = int_field(body, "seed", INT64_MIN)) {
    p.sampling.seed = static_cast<uint64_t>(*s);
    p.sampling.seeded = true;
  } else {
    p.sampling.seed = std::random_device{}();
  }
  if (auto x = number_field(body, "presence_penalty", -2.0, 2.0)) p.sampling.presence_penalty = static_cast<float>(*x);
  if (auto x = number_field(body, "frequency_penalty", -2.0, 2.0)) p.sampling.frequency_penalty = static_cast<float>(*x);
  if (auto x = number_field(body, "repetition_penalty", 0.01, 100.0)) p.sampling.repetition_penalty = static_cast<float>(*x);
  // mlx_lm.server's windows: a penalty over the last N tokens only (0 or absent: all).
  constexpr int64_t kMaxWindow = int64_t{1} << 24;
  if (auto n = int_field(body, "repetition_context_size", 0, kMaxWindow)) p.sampling.repetition_context_size = *n;
  if (auto n = int_field(body, "presence_context_size", 0, kMaxWindow)) p.sampling.presence_context_size = *n;
  if (auto n = int_field(body, "frequency_context_size", 0, kMaxWindow)) p.sampling.frequency_context_size = *n;
  if (auto x = number_field(body, "xtc_probability", 0.0, 1.0)) p.sampling.xtc_probability = static_cast<float>(*x);
  if (auto x = number_field(body, "xtc_threshold", 0.0, 1.0)) p.sampling.xtc_threshold = static_cast<float>(*x);
  p.sampling.logit_bias = check_logit_bias(body, ctx.vocab_size);
}

void apply_reasoning_effort(const std::string& effort, const char* name, CompletionParams& p) {
  bool thinking = true;
  if (effort == "none" || effort == "minimal")
    thinking = false;
  else if (effort != "low" && effort != "medium" && effort != "high" && effort != "xhigh")
    bad_field(name, "\"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
  if (p.thinking && *p.thinking != thinking) bad_field(name, "consistent with chat_template_kwargs.enable_thinking");
  p.thinking = thinking;
}

CompletionParams parse_openai_request(const ordered_json& body, bool chat, const RequestContext& ctx) {
  check_fields(body, chat ? Route::kChatCompletions : Route::kCompletions);
  check_model(body, ctx.model_id);
  CompletionParams p;
  p.chat = chat;
  if (chat) {
    p.messages = check_messages(body);
    p.tools = check_tools(body);
    parse_openai_tool_choice(body, p.tools, p);
    check_fixed_fields(body);
    parse_template_kwargs(body, p);
    if (auto effort = string_field(body, "reasoning_effort")) apply_reasoning_effort(*effort, "reasoning_effort", p);
  } else {
    const ordered_json* prompt = field(body, "prompt");
    if (!prompt) throw ApiError(400, "'prompt' is required", "prompt");
    if (!prompt->is_string()) bad_field("prompt", "a string");
    p.prompt = prompt->get<std::string>();
    if (p.prompt.empty()) bad_field("prompt", "a non-empty string");
  }
  p.max_tokens = int_field(body, "max_tokens", 1);
  if (auto n = int_field(body, "max_completion_tokens", 1)) p.max_tokens = n;
  if (auto n = int_field(body, "n", 1); n && *n != 1) bad_field("n", "1 (kettle returns one choice)");
  parse_openai_sampling(body, ctx, p);
  parse_logprobs(body, chat, p);
  p.stop = string_list_field(body, "stop", 4);
  p.stream = bool_field(body, "stream").value_or(false);
  p.ignore_eos = bool_field(body, "ignore_eos").value_or(false);
  if (const ordered_json* options = field(body, "stream_options")) {
    if (!options->is_object()) bad_field("stream_options", "an object");
    p.include_usage = bool_field(*options, "include_usage").value_or(false);
  }
  for (const char* informational : {"user", "safety_identifier", "prompt_cache_key"})
    (void)string_field(body, informational);  // identifiers (request_schema.cpp): checked, nothing to apply
  p.cache_salt = cache_salt_field(body);
  parse_openai_constraint(body, p);
  // llama-server's spellings: a schema and a GBNF grammar.
  if (const ordered_json* schema = field(body, "json_schema")) {
    OutputConstraint c = OutputConstraint::of(OutputConstraint::Kind::kJsonSchema, "json_schema");
    if (!schema->is_object() && !schema->is_boolean()) bad_field("json_schema", "a JSON schema (an object)");
    c.schema = *schema;
    if (p.constraint.kind != OutputConstraint::Kind::kNone)
      throw ApiError(400, fmt::format("'{}' and 'json_schema' both constrain the output; send one", p.constraint.field),
                     "json_schema");
    p.constraint = std::move(c);
  }
  if (const ordered_json* grammar = field(body, "grammar")) {
    if (!grammar->is_string()) bad_field("grammar", "a GBNF grammar (a string)");
    if (p.constraint.kind != OutputConstraint::Kind::kNone)
      throw ApiError(400, fmt::format("'{}' and 'grammar' both constrain the output; send one", p.constraint.field),
                     "grammar");
    p.constraint = OutputConstraint::of(OutputConstraint::Kind::kGrammar, "grammar");
    p.constraint.text = grammar->get<std::string>();
  }
  return p;
}

std::string openai_error_body(const ApiError& error) {
  std::string type = error.status() == 404   ? "not_found_error"
                     : error.status() == 401 ? "authentication_error"
                     : error.status() == 403 ? "permission_error"
                     : error.status() == 429 ? "rate_limit_error"
                     : error.status() >= 500 ? "server_error"
                                             : "invalid_request_error";
  json body = {{"error",
                {{"message", error.what()},
                 {"type", type},
                 {"param", error.param().empty() ? json(nullptr) : json(error.param())},
                 {"code", error.code().empty() ? json(nullptr) : json(error.code())}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);  // a message may quote a client's bytes
}

namespace {

json quantization_json(const QuantSummary& q) {
  if (q.bits == 0) return nullptr;
  json out = {{"mode", q.mode}, {"bits", q.bits}};
  if (q.mode != "fp8") out["group_size"] = q.group_size;
  else out["block_size"] = q.block[0] > 0 ? json::array({q.block[0], q.block[1]}) : json(nullptr);
  return out;
}

}  // namespace

json openai_model(const ModelCard& card) {
  const SamplingParams& d = card.defaults;
  return {{"id", card.id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "kettle"},
          {"context_window", card.context_length},
          {"max_model_len", card.context_length},  // vLLM's name for it
          {"weight_bytes", card.weight_bytes},
          {"quantization", quantization_json(card.quantization)},
          {"capabilities", card.capabilities},
          {"defaults",
           {{"temperature", d.temperature},
            {"top_p", d.top_p},
            {"top_k", d.top_k},
            {"min_p", d.min_p},
            {"repetition_penalty", d.repetition_penalty},
            {"presence_penalty", d.presence_penalty},
            {"frequency_penalty", d.frequency_penalty},
            // null: a request without max_tokens runs to EOS or the context
            {"max_tokens", card.default_max_tokens > 0 ? json(card.default_max_tokens) : json(nullptr)}}}};
}

json openai_model_list(const ModelCard& card) { return {{"object", "list"}, {"data", json::array({openai_model(card)})}}; }

namespace {

json usage_json(const TurnEnd& end) {
  json usage = {{"prompt_tokens", end.prompt_tokens},
                {"completion_tokens", end.completion_tokens},
                {"total_tokens", end.prompt_tokens + end.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", end.cached_tokens}}}};
  if (end.speculative) usage["speculation"] = speculation_usage(end);
  return usage;
}

json token_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

json tool_call_json(const ToolCall& call, size_t index, bool with_index) {
  json out = {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (with_index) out["index"] = index;
  return out;
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions: the legacy
// {tokens, token_logprobs, top_logprobs, text_offset} arrays.
class LogprobWriter {
 public:
  LogprobWriter(bool chat, int top) : chat_(chat), top_(top) {}

  json write(const std::vector<TokenLogprob>& tokens) {
    if (top_ < 0) return nullptr;
    if (chat_) {
      json content = json::array();
      for (const TokenLogprob& t : tokens) {
        json top = json::array();
        for (const TopLogprob& alt : t.top)
          top.push_back({{"token", alt.text}, {"logprob", alt.logprob}, {"bytes", token_bytes(alt.text)}});
        content.push_back(
            {{"token", t.text}, {"logprob", t.logprob}, {"bytes", token_bytes(t.text)}, {"top_logprobs", top}});
      }
      return {{"content", content}, {"refusal", nullptr}};
    }
    json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenLogprob& t : tokens) {
      texts.push_back(t.text);
      lps.push_back(t.logprob);
      json top = json::object();
      for (const TopLogprob& alt : t.top) top[alt.text] = alt.logprob;
      tops.push_back(top);
      offsets.push_back(offset_);
      offset_ += static_cast<int64_t>(t.text.size());
    }
    return {{"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

 private:
  bool chat_;
  int top_;
  int64_t offset_ = 0;
};

class OpenAiWriter : public ResponseWriter {
 public:
  OpenAiWriter(ResponseMeta meta, const CompletionParams& params)
      : meta_(std::move(meta)), chat_(params.chat), include_usage_(params.include_usage),
        logprobs_(params.chat, params.sampling.logprobs ? params.sampling.top_logprobs : -1) {}

  std::string error_body(const ApiError& error) const override { return openai_error_body(error); }

  std::string full_response(const Turn& turn, const TurnEnd& end) override {
    json choice;
    if (chat_) {
      json message = {{"role", "assistant"},
                      {"content", turn.content.empty() && !turn.tool_calls.empty() ? json(nullptr) : json(turn.content)}};
      if (!turn.reasoning.empty()) message["reasoning_content"] = turn.reasoning;
      if (!turn.tool_calls.empty()) {
        message["tool_calls"] = json::array();
        for (size_t i = 0; i < turn.tool_calls.size(); ++i)
          message["tool_calls"].push_back(tool_call_json(turn.tool_calls[i], i, false));
      }
      choice = {{"index", 0}, {"message", message}};
    } else {
      choice = {{"index", 0}, {"text", turn.content}};
    }
    choice["logprobs"] = logprobs_.write(turn.logprobs);
    choice["finish_reason"] = end.finish_reason;
    json out = envelope(false, json::array({choice}));
    out["usage"] = usage_json(end);
    return out.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  std::string stream_start(int64_t) override {
    if (!chat_) return "";
    return chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
  }

  std::string stream_delta(const TurnDelta& delta) override {
    std::string out;
    json lp = logprobs_.write(delta.logprobs);
    if (!chat_) return delta.content.empty() && delta.logprobs.empty() ? "" : chunk({{"content", delta.content}}, lp, nullptr);
    if (!delta.reasoning.empty()) out += chunk({{"reasoning_content", delta.reasoning}}, nullptr, nullptr);
    if (!delta.content.empty() || (!delta.logprobs.empty() && delta.tool_calls.empty()))
      out += chunk({{"content", delta.content}}, lp, nullptr);
    for (const ToolCall& call : delta.tool_calls)
      out += chunk({{"tool_calls", json::array({tool_call_json(call, tool_calls_sent_++, true)})}}, nullptr, nullptr);
    return out;
  }

  std::string stream_finish(const TurnEnd& end) override {
    std::string out = chunk(json::object(), nullptr, end.finish_reason);
    if (include_usage_) {
      json usage = envelope(true, json::array());
      usage["usage"] = usage_json(end);
      out += sse(usage);
    }
    return out + "data: [DONE]\n\n";
  }

  std::string stream_error(const ApiError& error) override {
    return "data: " + openai_error_body(error) + "\n\n";
  }

 private:
  json envelope(bool chunk, json choices) const {
    const char* object = !chat_ ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    return {{"id", meta_.id},         {"object", object},        {"created", meta_.created},
            {"model", meta_.model},   {"system_fingerprint", nullptr}, {"choices", std::move(choices)}};
  }

  std::string chunk(json delta, json logprobs, json finish_reason) const {
    json choice = chat_ ? json{{"index", 0}, {"delta", std::move(delta)}}
                        : json{{"index", 0}, {"text", delta.value("content", "")}};
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = std::move(finish_reason);
    json out = envelope(true, json::array({choice}));
    if (include_usage_) out["usage"] = nullptr;
    return sse(out);
  }

  static std::string sse(const json& data) {
    return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  ResponseMeta meta_;
  bool chat_;
  bool include_usage_;
  LogprobWriter logprobs_;
  size_t tool_calls_sent_ = 0;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_openai_writer(ResponseMeta meta, const CompletionParams& params) {
  return std::make_unique<OpenAiWriter>(std::move(meta), params);
}

}  // namespace kettle::server
