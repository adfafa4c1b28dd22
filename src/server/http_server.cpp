// Routes: / (the built-in chat page), /health, /v1/models, /v1/chat/completions, /v1/completions. A
// streaming response is a chunked content provider that pops engine events;
// a failed write (the client went away) cancels the generation.
#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <random>

#include "util/error.h"
#include "util/log.h"
#include "web_assets.h"  // generated from web/index.html (cmake/embed_file.cmake)

namespace kettle::server {
namespace {

using namespace std::chrono_literals;

std::string response_id(bool chat) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", rng());
}

std::string sse(const nlohmann::json& data) { return "data: " + data.dump() + "\n\n"; }

// State of one streamed response, shared by the provider calls and the releaser.
struct Stream {
  ResponseMeta meta;
  bool include_usage = false;
  bool sent_role = false;
  std::shared_ptr<EventChannel> channel;
};

}  // namespace

HttpServer::HttpServer(ServerConfig config, const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                       EngineWorker& engine)
    : config_(std::move(config)),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      engine_(engine),
      http_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::bind(const std::string& host, int port) {
  if (!http_->bind_to_port(host.c_str(), port))
    fail(ErrorCategory::kInvalidArgument, "serve: cannot listen on {}:{} (in use, or not an address of this machine)",
         host, port);
  port_ = port;
}

void HttpServer::listen() { http_->listen_after_bind(); }

void HttpServer::reply_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status();
  res.set_content(error_body(error), "application/json");
}

void HttpServer::routes() {
  http_->set_payload_max_length(config_.max_body_bytes);
  // Errors httplib raises itself (413, 404 for unknown paths, 400 for bad HTTP) get the OpenAI shape too.
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = res.status == 413   ? "the request body is larger than the server accepts (8 MB)"
                          : res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                                              : fmt::format("HTTP error {}", res.status);
    res.set_content(error_body(ApiError(res.status, message)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(ApiError(500, message)), "application/json");
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(web::kIndexHtml.data(), web::kIndexHtml.size(), "text/html; charset=utf-8");
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json model = {{"id", config_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "kettle"}};
    nlohmann::json body = {{"object", "list"}, {"data", nlohmann::json::array({model})}};
    res.set_content(body.dump(), "application/json");
  });
  http_->Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res, true); });
  http_->Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res, false); });
}

std::vector<int32_t> HttpServer::prompt_ids(const CompletionParams& params) {
  std::lock_guard lock(prompt_mutex_);
  if (!params.chat) return tokenizer_.encode(params.prompt, true);
  if (!chat_template_) throw ApiError(400, "this model has no chat template; use /v1/completions", "messages");
  try {
    std::string text = chat_template_->render(params.messages, nullptr, true);
    return tokenizer_.encode(text, false);
  } catch (const Error& e) {
    throw ApiError(e.http_status(), fmt::format("the chat template could not render the messages: {}", e.what()),
                   "messages");
  }
}

void HttpServer::request_began() {
  std::lock_guard lock(active_mutex_);
  ++active_;
}

void HttpServer::request_ended() {
  {
    std::lock_guard lock(active_mutex_);
    --active_;
  }
  active_changed_.notify_all();
}

void HttpServer::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  Job job;
  CompletionParams params;
  try {
    if (draining_) throw ApiError(503, "the server is shutting down");
    params = parse_completion_request(parse_body(req.body), chat, config_.sampling, config_.model_id);
    job.prompt = prompt_ids(params);
    const auto n_prompt = static_cast<int64_t>(job.prompt.size());
    if (n_prompt == 0) throw ApiError(400, "the prompt encodes to no tokens", chat ? "messages" : "prompt");
    const int64_t room = config_.context_length - n_prompt;
    if (params.max_tokens && *params.max_tokens > room)
      throw ApiError(400,
                     fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {} tokens",
                                 n_prompt, *params.max_tokens, config_.context_length),
                     "max_tokens", "context_length_exceeded");
    if (room < 1)
      throw ApiError(400, fmt::format("the prompt ({} tokens) fills the model's context of {} tokens", n_prompt,
                                      config_.context_length),
                     chat ? "messages" : "prompt", "context_length_exceeded");
    job.max_tokens = params.max_tokens.value_or(std::min(config_.default_max_tokens, room));
  } catch (const ApiError& e) {
    return reply_error(res, e);
  } catch (const Error& e) {
    return reply_error(res, ApiError(e.http_status(), e.what()));
  }
  job.sampling = params.sampling;
  job.stop = params.stop;
  job.ignore_eos = params.ignore_eos;
  job.channel = std::make_shared<EventChannel>();
  auto channel = job.channel;
  ResponseMeta meta{response_id(chat), static_cast<int64_t>(std::time(nullptr)), config_.model_id, chat};
  request_began();
  engine_.submit(std::move(job));

  if (!params.stream) {
    std::string text;
    for (;;) {
      std::optional<Event> e = channel->pop(1000ms);
      if (!e) continue;
      if (e->kind == Event::Kind::kText) {
        text += e->text;
      } else if (e->kind == Event::Kind::kDone) {
        res.set_content(full_response(meta, text, e->finish_reason, e->prompt_tokens, e->completion_tokens).dump(),
                        "application/json");
        break;
      } else {
        reply_error(res, ApiError(draining_ ? 503 : 500, e->text));
        break;
      }
    }
    request_ended();
    return;
  }

  auto stream = std::make_shared<Stream>(Stream{meta, params.include_usage, !chat, channel});
  auto with_usage = [stream](nlohmann::json chunk) {
    if (stream->include_usage && !chunk.contains("usage")) chunk["usage"] = nullptr;
    return sse(chunk);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, with_usage](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          stream->channel->cancel();  // the client went away: stop within one decode step
          return false;
        };
        if (!stream->sent_role) {
          stream->sent_role = true;
          return write(with_usage(role_chunk(stream->meta)));
        }
        std::optional<Event> e = stream->channel->pop(200ms);
        if (!e) return true;
        if (e->kind == Event::Kind::kText) return write(with_usage(text_chunk(stream->meta, e->text)));
        if (e->kind == Event::Kind::kError) {
          write(sse(nlohmann::json::parse(error_body(ApiError(500, e->text)))));
          sink.done();
          return true;
        }
        std::string tail = with_usage(finish_chunk(stream->meta, e->finish_reason));
        if (stream->include_usage) tail += sse(usage_chunk(stream->meta, e->prompt_tokens, e->completion_tokens));
        tail += "data: [DONE]\n\n";
        if (!write(tail)) return false;
        sink.done();
        return true;
      },
      [this, channel](bool) {
        channel->cancel();  // harmless once done; stops a generation whose response was abandoned
        request_ended();
      });
}

void HttpServer::shutdown(double drain_seconds) {
  draining_ = true;
  auto idle = [&] { return active_ == 0; };
  std::unique_lock lock(active_mutex_);
  if (!active_changed_.wait_for(lock, std::chrono::duration<double>(drain_seconds), idle)) {
    log::warn("shutdown: {} request(s) still running after {:.0f} s; cancelling", active_, drain_seconds);
    engine_.cancel_all("the server is shutting down");
    active_changed_.wait_for(lock, 5s, idle);
  }
  lock.unlock();
  http_->stop();
}

}  // namespace kettle::server
