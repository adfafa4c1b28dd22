// Routes (the chat page, /health, /stats, /metrics, /admin/cache/flush,
// /v1/models) and cross-cutting HTTP behaviour: CORS (any origin may call, as
// llama-server and vLLM allow by default; preflight answered), errors
// cpp-httplib raises itself in the OpenAI shape, and the drain on shutdown.
// Generation routes live in generation_handler.cpp.
#include "server/http_server.h"

#include <httplib.h>

#include <chrono>

#include "server/openai_protocol.h"
#include "util/error.h"
#include "util/log.h"
#include "web_assets.h"  // generated from web/index.html (cmake/embed_file.cmake)

namespace kettle::server {

using namespace std::chrono_literals;

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

void HttpServer::routes() {
  // A generation holds its HTTP thread until it ends: threads for every running and
  // queued one, plus some for the quick routes, so the queue bound (429) is reached
  // before requests wait unseen in httplib's own queue.
  const size_t threads = static_cast<size_t>(config_.batch + config_.max_queue + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  http_->Options(R"(/.*)", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers",
                   "Content-Type, Authorization, X-Api-Key, Anthropic-Version, Anthropic-Beta, OpenAI-Organization");
    res.set_header("Access-Control-Max-Age", "86400");
    res.status = 204;
  });
  // Errors httplib raises itself (413, 404 for unknown paths, 400 for bad HTTP) get the OpenAI shape too.
  const size_t max_body = config_.max_body_bytes;
  http_->set_error_handler(
      httplib::Server::HandlerWithResponse([max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = res.status == 413 ? fmt::format("the request body is larger than the server accepts ({} bytes)", max_body)
                              : res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                                                  : fmt::format("HTTP error {}", res.status);
        res.set_content(openai_error_body(ApiError(res.status, message)), "application/json");
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
    res.set_content(openai_error_body(ApiError(500, message)), "application/json");
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(web::kIndexHtml.data(), web::kIndexHtml.size(), "text/html; charset=utf-8");
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_->Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json stats = metrics_.stats(engine_.load(), config_.model_id);
    stats["context_length"] = config_.context_length;
    res.set_content(stats.dump(), "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.prometheus(engine_.load(), config_.model_id), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Post("/admin/cache/flush", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json body = {{"flushed_entries", engine_.flush_prefix_cache()}};
    res.set_content(body.dump(), "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(openai_model_list(config_.model_id, 0).dump(), "application/json");
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Api::kChat);
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Api::kCompletion);
  });
  http_->Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, Api::kMessages);
  });
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

void HttpServer::shutdown(double drain_seconds) {
  draining_ = true;
  auto idle = [&] { return active_ == 0; };
  std::unique_lock lock(active_mutex_);
  if (!active_changed_.wait_for(lock, std::chrono::duration<double>(drain_seconds), idle)) {
    log::warn("shutdown: {} request(s) still running after {:.1f} s; cancelling", active_, drain_seconds);
    engine_.cancel_all("the server is shutting down");
    active_changed_.wait_for(lock, 5s, idle);
  }
  lock.unlock();
  http_->stop();
}

}  // namespace kettle::server
