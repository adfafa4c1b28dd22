// Request checks name the field that is wrong, as OpenAI's API does in
// error.param; response shapes follow the OpenAI API reference for chat
// completions, completions and their stream chunks.
#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <random>

namespace kettle::server {

using ordered_json = nlohmann::ordered_json;

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(const ApiError& error) {
  nlohmann::json body = {{"error",
                          {{"message", error.what()},
                           {"type", error.type()},
                           {"param", error.param().empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param())},
                           {"code", error.code().empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code())}}}};
  return body.dump();
}

ordered_json parse_body(const std::string& body) {
  ordered_json json = ordered_json::parse(body, nullptr, false);
  if (json.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!json.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return json;
}

namespace {

[[noreturn]] void bad_field(const std::string& field, const std::string& expected) {
  throw ApiError(400, fmt::format("'{}' must be {}", field, expected), field);
}

const ordered_json* field(const ordered_json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number_field(const ordered_json& body, const char* name, double lo, double hi) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, "a number");
  double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad_field(name, fmt::format("between {} and {}", lo, hi));
  return x;
}

std::optional<int64_t> int_field(const ordered_json& body, const char* name, int64_t lo) {
  const ordered_json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad_field(name, "an integer");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) : v->get<int64_t>() < lo)
    bad_field(name, fmt::format("an integer >= {}", lo));
  return v->get<int64_t>();
}

bool bool_field(const ordered_json& body, const char* name) {
  const ordered_json* v = field(body, name);
  if (!v) return false;
  if (!v->is_boolean()) bad_field(name, "a boolean");
  return v->get<bool>();
}

std::string content_text(const ordered_json& content, const std::string& name) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(name, "a string or an array of text parts");
  std::string text;
  for (const ordered_json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad_field(name, "a string or an array of {\"type\": \"text\", \"text\": ...} parts");
    text += part["text"].get<std::string>();
  }
  return text;
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
    ordered_json copy = m;  // keeps the client's other keys (name, tool_calls) for the template
    copy["content"] = content_text(m.value("content", ordered_json()), name + ".content");
    out.push_back(std::move(copy));
  }
  return out;
}

std::vector<std::string> check_stop(const ordered_json& body) {
  const ordered_json* stop = field(body, "stop");
  if (!stop) return {};
  if (stop->is_string()) return {stop->get<std::string>()};
  if (!stop->is_array() || stop->size() > 4) bad_field("stop", "a string or an array of up to 4 strings");
  std::vector<std::string> out;
  for (const ordered_json& s : *stop) {
    if (!s.is_string()) bad_field("stop", "a string or an array of up to 4 strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

CompletionParams parse_completion_request(const ordered_json& body, bool chat, const SamplingParams& defaults,
                                          const std::string& model_id) {
  if (const ordered_json* model = field(body, "model")) {
    if (!model->is_string()) bad_field("model", "a string");
    const std::string name = model->get<std::string>();
    if (name != model_id && name != "default")
      throw ApiError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", name, model_id),
                     "model", "model_not_found");
  }
  CompletionParams p;
  p.chat = chat;
  if (chat) {
    p.messages = check_messages(body);
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
  p.sampling = defaults;
  if (auto t = number_field(body, "temperature", 0.0, 2.0)) p.sampling.temperature = static_cast<float>(*t);
  if (auto t = number_field(body, "top_p", 0.0, 1.0)) p.sampling.top_p = static_cast<float>(*t);
  if (auto k = int_field(body, "top_k", -1)) p.sampling.top_k = static_cast<int>(std::min<int64_t>(*k, 1 << 30));
  if (auto m = number_field(body, "min_p", 0.0, 1.0)) p.sampling.min_p = static_cast<float>(*m);
  if (auto s = int_field(body, "seed", INT64_MIN)) {
    p.sampling.seed = static_cast<uint64_t>(*s);
  } else {
    p.sampling.seed = std::random_device{}();
  }
  p.stop = check_stop(body);
  p.stream = bool_field(body, "stream");
  p.ignore_eos = bool_field(body, "ignore_eos");
  if (const ordered_json* options = field(body, "stream_options")) {
    if (!options->is_object()) bad_field("stream_options", "an object");
    p.include_usage = bool_field(*options, "include_usage");
  }
  if (const ordered_json* user = field(body, "user"); user && !user->is_string()) bad_field("user", "a string");
  return p;
}

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

nlohmann::json envelope(const ResponseMeta& meta, const char* chat_object, nlohmann::json choices) {
  return {{"id", meta.id},
          {"object", meta.chat ? chat_object : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", nullptr},
          {"choices", std::move(choices)}};
}

nlohmann::json chunk_choice(const ResponseMeta& meta, nlohmann::json delta, const nlohmann::json& finish_reason) {
  if (meta.chat)
    return {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  return {{"index", 0}, {"text", delta.value("content", "")}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
}

}  // namespace

nlohmann::json full_response(const ResponseMeta& meta, const std::string& text, const std::string& finish_reason,
                             int64_t prompt_tokens, int64_t completion_tokens) {
  nlohmann::json choice = meta.chat ? nlohmann::json{{"index", 0},
                                                     {"message", {{"role", "assistant"}, {"content", text}}},
                                                     {"logprobs", nullptr},
                                                     {"finish_reason", finish_reason}}
                                    : nlohmann::json{{"index", 0},
                                                     {"text", text},
                                                     {"logprobs", nullptr},
                                                     {"finish_reason", finish_reason}};
  nlohmann::json out = envelope(meta, "chat.completion", nlohmann::json::array({choice}));
  out["usage"] = usage_json(prompt_tokens, completion_tokens);
  return out;
}

nlohmann::json role_chunk(const ResponseMeta& meta) {
  return envelope(meta, "chat.completion.chunk",
                  nlohmann::json::array({chunk_choice(meta, {{"role", "assistant"}, {"content", ""}}, nullptr)}));
}

nlohmann::json text_chunk(const ResponseMeta& meta, const std::string& text) {
  return envelope(meta, "chat.completion.chunk", nlohmann::json::array({chunk_choice(meta, {{"content", text}}, nullptr)}));
}

nlohmann::json finish_chunk(const ResponseMeta& meta, const std::string& finish_reason) {
  return envelope(meta, "chat.completion.chunk",
                  nlohmann::json::array({chunk_choice(meta, nlohmann::json::object(), finish_reason)}));
}

nlohmann::json usage_chunk(const ResponseMeta& meta, int64_t prompt_tokens, int64_t completion_tokens) {
  nlohmann::json out = envelope(meta, "chat.completion.chunk", nlohmann::json::array());
  out["usage"] = usage_json(prompt_tokens, completion_tokens);
  return out;
}

}  // namespace kettle::server
