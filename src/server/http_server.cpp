// Routes (the chat page, /health, /stats, /metrics, /admin/cache/flush (the
// disk tier's durability barrier) and /admin/cache/clear, /v1/models, the generation routes) and what every route shares: access
// (Host, Origin, API key, admin from loopback), 404 and 405 with Allow, CORS
// preflight, security headers, errors in the OpenAI shape, and the drain on
// shutdown. Generation routes live in generation_handler.cpp.
#include "server/http_server.h"

#include <chrono>
#include <cstring>
#include <functional>

#include "chat/output_parser.h"
#include "server/anthropic_protocol.h"
#include "server/openai_protocol.h"
#include "util/error.h"
#include "util/log.h"
#include "web_assets.h"  // generated from web/index.html (cmake/embed_file.cmake)

namespace kettle::server {

using namespace std::chrono_literals;

namespace {

// What each route answers to; the page and /health need no key.
struct RouteSpec {
  const char* path;
  const char* method;  // one, or a list ("GET, DELETE")
  bool open;
  bool prefix = false;  // the path and anything after it (/v1/models/{id})

  bool takes(const std::string& m) const {
    const std::string_view methods(method);
    for (size_t at = methods.find(m); at != std::string_view::npos; at = methods.find(m, at + 1)) {
      const size_t end = at + m.size();
      if ((at == 0 || methods[at - 1] == ' ') && (end == methods.size() || methods[end] == ',')) return true;
    }
    return false;
  }
};
constexpr RouteSpec kRoutes[] = {
    {"/", "GET", true},
    {"/health", "GET", true},
    {"/stats", "GET", false},
    {"/metrics", "GET", false},
    {"/v1/models", "GET", false},
    {"/v1/models/", "GET", false, true},
    {"/admin/cache/flush", "POST", false},
    {"/admin/cache/clear", "POST", false},
    {"/v1/chat/completions", "POST", false},
    {"/v1/completions", "POST", false},
    {"/v1/messages", "POST", false},
    {"/v1/responses", "POST", false},
    {"/v1/embeddings", "POST", false},
    {"/v1/responses/", "GET, DELETE", false, true},
};

const RouteSpec* find_route(const std::string& path) {
  for (const RouteSpec& r : kRoutes)
    if (path == r.path || (r.prefix && path.size() > std::strlen(r.path) && path.rfind(r.path, 0) == 0)) return &r;
  return nullptr;
}

http::Response json_response(int status, std::string body) { return http::Response(status, "application/json", std::move(body)); }

// 200 when every cached block is on disk; 503 with the counts when not.
http::Response flush_response(const CacheFlushReport& r) {
  nlohmann::json body = {{"durable", r.durable},     {"not_on_disk", r.not_on_disk}, {"queued", r.queued},
                         {"written", r.written},     {"dropped", r.dropped},         {"errors", r.errors},
                         {"spilling", r.spilling}};
  if (!r.durable)
    body["error"] = {{"message", fmt::format("{} cached blocks are not on disk ({})", r.not_on_disk,
                                             r.spilling ? "the disk tier did not finish in time, or there is none"
                                                        : "the disk tier stopped writing or there is none")},
                     {"type", "unavailable"}};
  return json_response(r.durable ? 200 : 503, body.dump());
}

// The page runs only its own inline code, talks only to this server, and is never framed.
void add_page_headers(http::Response& r) {
  r.set_header("Content-Security-Policy",
               "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  r.set_header("X-Frame-Options", "DENY");
  r.set_header("Referrer-Policy", "no-referrer");
}

}  // namespace

HttpServer::HttpServer(ServerConfig config, const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                       Engine& engine)
    : config_(std::move(config)),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      engine_(engine),
      access_(config_.access),
      special_strings_(tokenizer.special_token_strings()),
      responses_(config_.response_store_bytes, std::chrono::seconds(config_.response_ttl_seconds)),
      events_(
          config_.http, [this](std::shared_ptr<http::Exchange> exchange) { route(exchange); },
          [](int status, const std::string& message) { return openai_error_body(ApiError(status, message)); }),
      // A generation holds its thread until it ends: threads for every running and queued
      // one, plus some for the admin routes, so the queue bound (429) is reached first.
      workers_(config_.batch + config_.max_queue + 8) {}

HttpServer::~HttpServer() = default;

http::Response HttpServer::error_response(const ApiError& e, Api api) {
  http::Response r = json_response(e.status(), api == Api::kMessages ? anthropic_error_body(e) : openai_error_body(e));
  if (e.status() == 401) r.set_header("WWW-Authenticate", "Bearer");
  if (e.status() == 429 || e.status() == 503) r.set_header("Retry-After", "1");
  return r;
}

void HttpServer::bind(const std::string& host, int port) { events_.bind(host, port); }

void HttpServer::listen() { events_.run(); }

void HttpServer::route(const std::shared_ptr<http::Exchange>& exchange) {
  http::Exchange& ex = *exchange;
  const http::Request& req = ex.request();
  ex.add_header("X-Content-Type-Options", "nosniff");
  const RouteSpec* spec = find_route(req.path);
  try {
    access_.check_site(req);
    for (http::Header& h : access_.cors_headers(req)) ex.add_header(std::move(h.name), std::move(h.value));
    if (req.method == "OPTIONS") {  // CORS preflight (an allowed origin: check_site passed)
      http::Response r(204, "text/plain", "");
      r.set_header("Access-Control-Allow-Methods", spec ? fmt::format("{}, OPTIONS", spec->method) : "GET, POST, OPTIONS");
      r.set_header("Access-Control-Allow-Headers",
                   "Content-Type, Authorization, X-Api-Key, Anthropic-Version, Anthropic-Beta, OpenAI-Organization, "
                   "X-Stainless-Lang, X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, X-Stainless-Runtime, "
                   "X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout");
      r.set_header("Access-Control-Max-Age", "86400");
      return ex.reply(std::move(r));
    }
    if (!spec) throw ApiError(404, fmt::format("no route for {} {}", req.method, req.path));
    const bool head_of_get = req.method == "HEAD" && spec->takes("GET");
    if (!spec->takes(req.method) && !head_of_get) {
      http::Response r = error_response(ApiError(405, fmt::format("{} takes {}, not {}", spec->path, spec->method, req.method)));
      r.set_header("Allow", std::string(spec->method) + (spec->takes("GET") ? ", HEAD" : ""));
      return ex.reply(std::move(r));
    }
    const int key_index = spec->open ? 0 : access_.authenticate(req);
    const std::string path = spec->path;
    if (path.rfind("/admin/", 0) == 0) access_.check_admin(req);
    if (path == "/v1/responses/") return answer_stored_response(ex, req.path.substr(path.size()));
    const bool generation = path.rfind("/v1/", 0) == 0 && path.rfind("/v1/models", 0) != 0;
    if (!generation && path.rfind("/admin/cache/", 0) != 0) return answer_quick(ex, path);
    const Api api = path == "/v1/chat/completions" ? Api::kChat
                    : path == "/v1/completions"    ? Api::kCompletion
                    : path == "/v1/responses"      ? Api::kResponses
                                                   : Api::kMessages;
    std::shared_ptr<http::Exchange> held = exchange;
    auto task = [this, held, generation, api, key_index, path] {
      try {
        if (path == "/v1/embeddings") return handle_embeddings(*held);
        if (generation) return handle_generation(*held, api, key_index);
        if (path == "/admin/cache/clear")
          return held->reply(json_response(200, nlohmann::json{{"cleared_entries", engine_.clear_prefix_cache()}}.dump()));
        held->reply(flush_response(engine_.flush_cache_to_disk(config_.flush_timeout_seconds)));
      } catch (const std::exception& e) {
        held->reply(error_response(ApiError(500, e.what())));
      }
    };
    if (!workers_.try_run(std::move(task)))
      throw ApiError(503, "the server is busy: every request thread is taken; retry shortly");
  } catch (const ApiError& e) {
    if (spec && std::string_view(spec->path) == "/v1/messages") return reply_error(ex, Api::kMessages, e, spec->path);
    ex.reply(error_response(e));
  }
}

void HttpServer::answer_quick(http::Exchange& ex, const std::string& path) {
  if (path == "/") {
    http::Response r(200, "text/html; charset=utf-8", std::string(web::kIndexHtml));
    add_page_headers(r);
    return ex.reply(std::move(r));
  }
  if (path == "/health") return ex.reply(json_response(200, draining_ ? R"({"status":"draining"})" : R"({"status":"ok"})"));
  if (path == "/stats") {
    nlohmann::json stats = metrics_.stats(engine_.load(), config_.model_id);
    stats["context_length"] = config_.context_length;
    const http::ServerCounters c = events_.counters();
    stats["connections"] = {{"open", c.open}, {"accepted", c.accepted}, {"refused", c.refused}, {"timed_out", c.timed_out}};
    return ex.reply(json_response(200, stats.dump()));
  }
  if (path == "/metrics")
    return ex.reply(http::Response(200, "text/plain; version=0.0.4; charset=utf-8",
                                   metrics_.prometheus(engine_.load(), config_.model_id)));
  // /v1/models, or /v1/models/{id}: any id names the one model served, as any request's
  // model does; the answer names the served id.
  if (path == "/v1/models") return ex.reply(json_response(200, openai_model_list(model_card()).dump()));
  ex.reply(json_response(200, openai_model(model_card()).dump()));
}

void HttpServer::answer_stored_response(http::Exchange& ex, const std::string& id) {
  if (ex.request().method == "DELETE") {
    if (!responses_.erase(id)) throw ApiError(404, fmt::format("no stored response '{}'", id));
    return ex.reply(json_response(200, nlohmann::json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}}.dump()));
  }
  std::optional<ResponseStore::Entry> entry = responses_.get(id);
  if (!entry) throw ApiError(404, fmt::format("no stored response '{}' (never stored, deleted, or expired)", id));
  ex.reply(json_response(200, entry->response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
}

ModelCard HttpServer::model_card() const {
  ModelCard card{config_.model_id,      config_.context_length, config_.weight_bytes, config_.quantization,
                 {"completion"},         config_.sampling,       config_.default_max_tokens};
  if (config_.embedding) {
    card.capabilities = {"embedding"};
    return card;
  }
  if (chat_template_) {
    card.capabilities.emplace_back("chat");
    if (detect_output_format(chat_template_->source(true)).tool_calls != ToolCallFormat::kNone)
      card.capabilities.emplace_back("tools");
    if (detect_output_format(chat_template_->source(false)).reasoning) card.capabilities.emplace_back("thinking");
  }
  return card;
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
  events_.drain();  // no new connections; idle keep-alive ones closed now
  auto idle = [&] { return active_ == 0; };
  std::unique_lock lock(active_mutex_);
  if (!active_changed_.wait_for(lock, std::chrono::duration<double>(drain_seconds), idle)) {
    log::warn("shutdown: {} request(s) still running after {:.1f} s; cancelling", active_, drain_seconds);
    engine_.cancel_all("the server is shutting down");
    active_changed_.wait_for(lock, 5s, idle);
  }
  lock.unlock();
  events_.stop();
}

}  // namespace kettle::server
