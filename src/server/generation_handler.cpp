// The generation routes (/v1/chat/completions, /v1/completions, /v1/messages):
// check the request with its protocol's parser, render and tokenize the prompt,
// admit it (or 429 when the queue is full), hand it to the engine, and relay
// the engine's events through a TurnBuilder (reasoning and tool calls parsed
// out) into the protocol's ResponseWriter — whole, or as server-sent events.
// A client that goes away cancels its generation: the event loop sees its
// hang-up (or a failed write) and the exchange reports the client gone.
#include <chrono>
#include <ctime>
#include <optional>
#include <random>

#include "server/anthropic_protocol.h"
#include "server/http_server.h"
#include "server/literal_content.h"
#include "server/openai_protocol.h"
#include "server/output_constraint.h"
#include "server/request_fields.h"
#include "server/responses_protocol.h"
#include "server/turn_builder.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::server {

using namespace std::chrono_literals;

// nginx's "client closed request": recorded for generations whose client left.
constexpr int kClientClosed = 499;

struct HttpServer::Prepared {
  Api api = Api::kChat;
  const char* route = "";
  CompletionParams params;
  GenerationRequest request;
  std::shared_ptr<EventChannel> channel = std::make_shared<EventChannel>();
  OutputParserOptions parse;
  std::unique_ptr<ResponseWriter> writer;
};

namespace {

const char* route_of(int api) {
  static const char* const routes[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"};
  return routes[api];
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

// An assistant message last in the conversation is a prefix the model continues
// (Anthropic's prefill, transformers' continue_final_message).
bool continues_final_message(const nlohmann::ordered_json& messages) {
  const auto& last = messages.back();
  return field_is(last, "role", "assistant") && last.contains("content") && last["content"].is_string() &&
         !last["content"].get<std::string>().empty() && !last.contains("tool_calls");
}

}  // namespace

std::unique_ptr<ResponseWriter> HttpServer::response_writer(Api api, const CompletionParams& params) const {
  const auto created = static_cast<int64_t>(std::time(nullptr));
  switch (api) {
    case Api::kChat: return make_openai_writer({random_id("chatcmpl-"), created, config_.model_id}, params);
    case Api::kCompletion: return make_openai_writer({random_id("cmpl-"), created, config_.model_id}, params);
    case Api::kMessages:
    case Api::kResponses: break;  // the Responses writer is made with its request (prepare)
  }
  return make_anthropic_writer(random_id("msg_"), config_.model_id);
}

int64_t HttpServer::default_max_tokens(int64_t n_prompt, int64_t room) const {
  if (config_.default_max_tokens > 0) return std::min(config_.default_max_tokens, room);
  const size_t capacity = engine_.kv_admission_capacity();
  if (capacity == 0 || engine_.kv_bytes(n_prompt + room) <= capacity) return room;
  // The longest generation whose KV fits (kv_bytes grows with the tokens); at least one token,
  // so a prompt that alone exceeds the budget is refused by the check after this.
  int64_t lo = 1, hi = room;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (engine_.kv_bytes(n_prompt + mid) <= capacity) lo = mid; else hi = mid - 1;
  }
  return lo;
}

grammar::ConstraintCache& HttpServer::constraints() {
  std::call_once(constraints_once_, [this] {
    auto vocabulary = std::make_shared<grammar::TokenVocabulary>(
        grammar::TokenVocabulary::from_tokenizer(tokenizer_, config_.end_ids));
    constraints_ = std::make_unique<grammar::ConstraintCache>(std::move(vocabulary));
  });
  return *constraints_;
}

void HttpServer::reply_error(http::Exchange& exchange, Api api, const ApiError& error, const char* route) {
  metrics_.record_request(route, error.status());
  exchange.reply(error_response(error, api));
}

HttpServer::Prepared HttpServer::prepare(const http::Request& req, Api api, int key_index) {
  if (draining_) throw ApiError(503, "the server is shutting down");
  Prepared p;
  p.api = api;
  p.route = route_of(static_cast<int>(api));
  if (config_.embedding)
    throw ApiError(400, fmt::format("{} is an embedding model: it answers /v1/embeddings, not {}", config_.model_id,
                                    p.route),
                   "model", "model_not_generative");
  RequestContext ctx{config_.model_id, config_.vocab_size, config_.sampling};
  nlohmann::ordered_json body = parse_body(req.body);
  std::optional<ResponsesRequest> responses;
  if (api == Api::kResponses) {
    responses = parse_responses_request(body, ctx, responses_);
    p.params = responses->params;
  } else {
    p.params = api == Api::kMessages ? parse_anthropic_request(body, ctx) : parse_openai_request(body, api == Api::kChat, ctx);
  }
  validate_sampling(p.params.sampling, config_.vocab_size);  // the engine's own checks, answered before queueing
  const CompletionParams& params = p.params;
  const char* prompt_field = params.chat ? "messages" : "prompt";
  bool thinking = false;  // whether the model may reason before answering

  {
    std::lock_guard lock(prompt_mutex_);
    if (!params.chat) {
      p.request.prompt = tokenizer_.encode(params.prompt, true);
    } else {
      if (!chat_template_) throw ApiError(400, "this model has no chat template; use /v1/completions", "messages");
      nlohmann::ordered_json vars = params.template_vars;
      vars["enable_thinking"] = params.thinking.value_or(config_.thinking);
      const bool has_tools = !params.tools.is_null();
      // --literal-special-tokens: control-token strings in the content render as markers first.
      std::optional<LiteralContent> literal;
      nlohmann::ordered_json marked;
      const nlohmann::ordered_json* messages = &params.messages;
      if (config_.literal_special_tokens) {
        literal.emplace(special_strings_);
        marked = params.messages;
        literal->mark(marked);
        messages = &marked;
      }
      std::string text;
      try {
        if (continues_final_message(*messages)) {
          // Rendered without a generation prompt, then cut right after the final message's text.
          const std::string prefix = messages->back()["content"].get<std::string>();
          text = chat_template_->render(*messages, params.tools, false, vars);
          size_t at = text.rfind(prefix);
          if (at == std::string::npos)
            throw ApiError(400, "the chat template does not show the final assistant message; it cannot be continued",
                           "messages");
          text.resize(at + prefix.size());
        } else {
          text = chat_template_->render(*messages, params.tools, true, vars);
        }
      } catch (const Error& e) {
        throw ApiError(e.http_status(), fmt::format("the chat template could not render the messages: {}", e.what()),
                       "messages");
      }
      const std::vector<Tokenizer::Span> spans = literal ? literal->restore(text) : std::vector<Tokenizer::Span>{};
      p.request.prompt = tokenizer_.encode(text, false, spans);
      p.parse.format = detect_output_format(chat_template_->source(has_tools));
      p.parse.tools_requested = has_tools;
      p.parse.starts_in_reasoning = p.parse.format.reasoning && prompt_opens_reasoning(text);
      thinking = params.thinking.value_or(config_.thinking);
    }
  }
  const auto n_prompt = static_cast<int64_t>(p.request.prompt.size());
  if (n_prompt == 0) throw ApiError(400, "the prompt encodes to no tokens", prompt_field);
  const int64_t room = config_.context_length - n_prompt;
  if (params.max_tokens && *params.max_tokens > room)
    throw ApiError(400,
                   fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {} tokens",
                               n_prompt, *params.max_tokens, config_.context_length),
                   "max_tokens", "context_length_exceeded");
  if (room < 1)
    throw ApiError(400, fmt::format("the prompt ({} tokens) fills the model's context of {} tokens", n_prompt,
                                    config_.context_length),
                   prompt_field, "context_length_exceeded");
  const int64_t max_tokens = params.max_tokens.value_or(default_max_tokens(n_prompt, room));
  const size_t kv_need = engine_.kv_bytes(n_prompt + max_tokens), kv_budget = engine_.kv_budget_bytes();
  if (engine_.kv_admission_capacity() > 0 && kv_need > engine_.kv_admission_capacity())
    throw ApiError(400,
                   fmt::format("the prompt ({} tokens) plus max_tokens ({}) needs {:.2f} GB of KV cache; this server's "
                               "--kv-budget is {:.2f} GB",
                               n_prompt, max_tokens, static_cast<double>(kv_need) / 1e9,
                               static_cast<double>(kv_budget) / 1e9),
                   params.max_tokens ? "max_tokens" : prompt_field, "kv_budget_exceeded");
  if (engine_.load().queued >= config_.max_queue)
    throw ApiError(429, fmt::format("the server is busy: {} requests are already waiting; retry shortly", config_.max_queue));

  if (params.constraint.kind != OutputConstraint::Kind::kNone) {
    // A request with thinking off gets no <think> block before its constrained output.
    OutputParserOptions shape = p.parse;
    shape.format.reasoning = shape.format.reasoning && (thinking || shape.starts_in_reasoning);
    const std::string gbnf = constraint_gbnf(params.constraint, shape, params.tools);
    try {
      p.request.constraint = constraints().get(gbnf, kConstraintRoot, fmt::format("grammar of '{}'", params.constraint.field));
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("'{}' cannot be enforced: {}", params.constraint.field, e.what()),
                     params.constraint.field);
    }
  }
  p.request.max_tokens = max_tokens;
  p.request.sampling = params.sampling;
  p.request.stop = params.stop;
  p.request.ignore_eos = params.ignore_eos;
  p.request.route = req.path;
  // Cached prefixes are shared only between requests of one key and one cache_salt.
  if (key_index != 0 || !params.cache_salt.empty())
    p.request.cache_scope = std::hash<std::string>{}(fmt::format("{}\x1f{}", key_index, params.cache_salt)) | 1;
  if (responses) {
    const ResponsesMeta meta{random_id("resp_"), static_cast<int64_t>(std::time(nullptr)), config_.model_id};
    p.writer = make_responses_writer(meta, std::move(*responses), [this](const nlohmann::ordered_json& response,
                                                                         nlohmann::ordered_json conversation) {
      responses_.put(response["id"].get<std::string>(), {response, std::move(conversation)});
    });
  } else {
    p.writer = response_writer(api, params);
  }
  return p;
}

void HttpServer::handle_generation(http::Exchange& exchange, Api api, int key_index) {
  Prepared prepared;
  try {
    prepared = prepare(exchange.request(), api, key_index);
  } catch (const ApiError& e) {
    return reply_error(exchange, api, e, route_of(static_cast<int>(api)));
  } catch (const Error& e) {
    return reply_error(exchange, api, ApiError(e.http_status(), e.what()), route_of(static_cast<int>(api)));
  }
  request_began();
  struct Ended {
    HttpServer* server;
    ~Ended() { server->request_ended(); }
  } ended{this};
  engine_.submit(prepared.request, prepared.channel);
  if (prepared.params.stream) return reply_stream(exchange, prepared);
  reply_whole(exchange, prepared);
}

void HttpServer::reply_whole(http::Exchange& exchange, Prepared& p) {
  EventChannel& channel = *p.channel;
  TurnBuilder builder(p.parse, p.api == Api::kMessages ? "toolu_" : "call_");
  Turn turn;
  for (;;) {
    // Every 100 ms, whether or not tokens are flowing: a client that left stops its generation.
    if (!channel.cancelled() && exchange.client_gone()) channel.cancel();
    std::optional<Event> e = channel.pop(100ms);
    if (!e) continue;
    if (e->kind == Event::Kind::kText) {
      turn.add(builder.push(*e));
    } else if (e->kind == Event::Kind::kDone) {
      turn.add(builder.finish());
      // Counted before the client hears: what it asks /stats next already includes this.
      metrics_.record_request(p.route, 200);
      metrics_.record_generation(e->prompt_tokens, e->completion_tokens, e->prefill_seconds, e->decode_seconds,
                                 e->queue_seconds + e->prefill_seconds);
      exchange.reply(http::Response(200, "application/json", p.writer->full_response(turn, builder.end(*e))));
      return;
    } else {
      const int status = draining_ ? 503 : channel.cancelled() ? kClientClosed : 500;
      metrics_.record_request(p.route, status);
      exchange.reply(http::Response(status, "application/json", p.writer->error_body(ApiError(status, e->text))));
      return;
    }
  }
}

void HttpServer::reply_stream(http::Exchange& exchange, Prepared& p) {
  EventChannel& channel = *p.channel;
  TurnBuilder builder(p.parse, p.api == Api::kMessages ? "toolu_" : "call_");
  http::Response head(200, "text/event-stream", "");
  head.set_header("Cache-Control", "no-cache");
  exchange.start_stream(std::move(head));
  auto client_left = [&] {
    channel.cancel();  // stop within one decode step
    metrics_.record_request(p.route, kClientClosed);
  };
  auto write = [&](const std::string& s) {
    if (exchange.write(s)) return true;
    client_left();
    return false;
  };
  if (!write(p.writer->stream_start(static_cast<int64_t>(p.request.prompt.size())))) return;
  for (;;) {
    std::optional<Event> e = channel.pop(100ms);
    if (!e) {
      if (exchange.client_gone()) return client_left();
      continue;
    }
    if (e->kind == Event::Kind::kText) {
      if (!write(p.writer->stream_delta(builder.push(*e)))) return;
      continue;
    }
    if (e->kind == Event::Kind::kError) {
      const int status = draining_ ? 503 : 500;
      metrics_.record_request(p.route, channel.cancelled() && !draining_ ? kClientClosed : status);
      exchange.write(p.writer->stream_error(ApiError(status, e->text)));
      return exchange.finish();
    }
    std::string tail = p.writer->stream_delta(builder.finish());
    tail += p.writer->stream_finish(builder.end(*e));
    metrics_.record_request(p.route, 200);
    metrics_.record_generation(e->prompt_tokens, e->completion_tokens, e->prefill_seconds, e->decode_seconds,
                               e->queue_seconds + e->prefill_seconds);
    if (write(tail)) exchange.finish();
    return;
  }
}

}  // namespace kettle::server
