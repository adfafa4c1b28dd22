#include "server/engine_proxy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <thread>

#include "server/anthropic_protocol.h"
#include "server/http/upstream.h"
#include "server/json_reader.h"
#include "server/openai_protocol.h"
#include "util/log.h"

namespace kettle::server {
namespace {

constexpr double kNoTimeout = 1e9;  // a whole response comes when its generation ends; the client's leaving ends the wait

http::Response json_reply(int status, std::string body) { return http::Response(status, "application/json", std::move(body)); }

ApiError engine_unavailable(int status, const std::string& why) { return ApiError(status, why, "", "engine_unavailable"); }

http::Response error_reply(const ApiError& e, const std::string& path) {
  http::Response r = json_reply(e.status(), path == "/v1/messages" ? anthropic_error_body(e) : openai_error_body(e));
  if (e.status() == 503) r.set_header("Retry-After", "5");
  return r;
}

// The "sequence_number" of the last Responses API event seen in a stream (-1: none).
void note_sequence(const std::string& piece, int64_t& last) {
  constexpr std::string_view kKey = "\"sequence_number\":";
  for (size_t at = piece.find(kKey); at != std::string::npos; at = piece.find(kKey, at + 1)) {
    size_t from = at + kKey.size();
    while (from < piece.size() && piece[from] == ' ') ++from;
    if (from < piece.size() && piece[from] >= '0' && piece[from] <= '9')
      last = std::max<int64_t>(last, std::strtoll(piece.c_str() + from, nullptr, 10));
  }
}

// The error event that ends a stream the engine stopped answering, in the shape of its API.
std::string stream_error_event(const std::string& path, const ApiError& e, int64_t last_sequence) {
  if (path == "/v1/messages") return fmt::format("event: error\ndata: {}\n\n", anthropic_error_body(e));
  if (path == "/v1/responses") {
    const nlohmann::json event = {{"type", "error"}, {"code", e.code()}, {"message", e.what()},
                                  {"param", nullptr}, {"sequence_number", last_sequence + 1}};
    return fmt::format("event: error\ndata: {}\n\n", event.dump());
  }
  return fmt::format("data: {}\n\n", openai_error_body(e));
}

bool is_event_stream(const http::Response& head) {
  const std::string* type = head.header("content-type");
  return type && type->rfind("text/event-stream", 0) == 0;
}

}  // namespace

EngineProxy::EngineProxy(ProxyConfig config, EnginePool& pool)
    : config_(std::move(config)),
      pool_(pool),
      access_(config_.access),
      events_(
          config_.http, [this](std::shared_ptr<http::Exchange> exchange) { route(exchange); },
          [](int status, const std::string& message) { return openai_error_body(ApiError(status, message)); }),
      workers_(config_.workers) {}

EngineProxy::~EngineProxy() = default;

void EngineProxy::route(const std::shared_ptr<http::Exchange>& exchange) {
  http::Exchange& ex = *exchange;
  const http::Request& req = ex.request();
  if (req.path == "/health" && (req.method == "GET" || req.method == "HEAD")) return answer_health(ex);
  if (req.path == "/engine" && (req.method == "GET" || req.method == "HEAD")) return answer_engine(ex);
  if (pool_.route_by_model() && req.path == "/v1/models" && req.method == "GET") return answer_models(ex);
  if (draining_) return ex.reply(error_reply(engine_unavailable(503, "the server is shutting down"), req.path));
  {
    std::lock_guard lock(active_mutex_);
    ++active_;
  }
  std::shared_ptr<http::Exchange> held = exchange;
  const bool started = workers_.try_run([this, held] {
    try {
      relay(*held);
    } catch (const ApiError& e) {  // the model named no local model, or no engine could take it
      held->reply(error_reply(e, held->request().path));
    } catch (const std::exception& e) {
      held->reply(error_reply(ApiError(500, e.what()), held->request().path));
    }
    std::lock_guard lock(active_mutex_);
    --active_;
    active_changed_.notify_all();
  });
  if (!started) {
    {
      std::lock_guard lock(active_mutex_);
      --active_;
    }
    ex.reply(error_reply(ApiError(503, "the server is busy: every request thread is taken; retry shortly"), req.path));
  }
}

namespace {

nlohmann::json engine_json(const EnginePool::EngineView& e) {
  nlohmann::json j = nlohmann::json::parse(e.status.json());
  j["model"] = e.model.id;
  j["folder"] = e.model.folder;
  j["requests"] = e.active;
  if (e.stopping) j["state"] = "stopping";
  return j;
}

// --isolate's one engine's status (stopped before it exists).
EngineStatus only_engine_status(const std::vector<EnginePool::EngineView>& engines) {
  EngineStatus s;
  s.state = EngineState::kStopped;
  if (!engines.empty()) s = engines.front().status;
  return s;
}

}  // namespace

void EngineProxy::answer_health(http::Exchange& ex) {
  const std::vector<EnginePool::EngineView> engines = pool_.engines();
  if (!pool_.route_by_model()) {  // --isolate: the one engine's state
    const EngineStatus s = only_engine_status(engines);
    const bool ok = s.state == EngineState::kReady && !draining_;
    const char* status = draining_                            ? "draining"
                         : s.state == EngineState::kReady    ? "ok"
                         : s.state == EngineState::kStarting ? "loading"
                                                             : engine_state_name(s.state);
    return ex.reply(json_reply(ok ? 200 : 503, fmt::format(R"({{"status":"{}","engine":{}}})", status, s.json())));
  }
  // A model pool is healthy while an engine is ready (the others load on demand).
  bool ready = false, loading = false;
  nlohmann::json list = nlohmann::json::array();
  for (const EnginePool::EngineView& e : engines) {
    ready = ready || (e.status.state == EngineState::kReady && !e.stopping);
    loading = loading || e.status.state == EngineState::kStarting || e.status.state == EngineState::kBackoff;
    list.push_back(engine_json(e));
  }
  const bool ok = ready && !draining_;
  const char* status = draining_ ? "draining" : ready ? "ok" : loading ? "loading" : "down";
  ex.reply(json_reply(ok ? 200 : 503, nlohmann::json({{"status", status}, {"engines", list}}).dump()));
}

bool EngineProxy::allowed(http::Exchange& ex) {
  try {
    access_.check_site(ex.request());
    access_.authenticate(ex.request());
    return true;
  } catch (const ApiError& e) {
    http::Response r = error_reply(e, ex.request().path);
    if (e.status() == 401) r.set_header("WWW-Authenticate", "Bearer");
    ex.reply(std::move(r));
    return false;
  }
}

void EngineProxy::answer_engine(http::Exchange& ex) {
  if (!allowed(ex)) return;
  const std::vector<EnginePool::EngineView> engines = pool_.engines();
  if (!pool_.route_by_model()) return ex.reply(json_reply(200, only_engine_status(engines).json()));
  nlohmann::json list = nlohmann::json::array();
  for (const EnginePool::EngineView& e : engines) list.push_back(engine_json(e));
  ex.reply(json_reply(200, nlohmann::json({{"capacity", pool_.capacity()}, {"engines", list}}).dump()));
}

// Every local model a request may name, as OpenAI's model list, each with what `kettle ls` says of it
// (bytes, quantization, whether it fits an engine's share of the device) and whether an engine runs it now.
void EngineProxy::answer_models(http::Exchange& ex) {
  if (!allowed(ex)) return;
  const nlohmann::json rows = config_.local_model_rows ? config_.local_model_rows() : nlohmann::json::array();
  std::map<std::string, const nlohmann::json*> by_folder;  // the rows by their folders' canonical paths
  for (const nlohmann::json& row : rows)
    if (row.is_object() && row.contains("folder") && row["folder"].is_string())
      by_folder.emplace(canonical_folder(row["folder"].get<std::string>()), &row);
  std::vector<std::string> loaded;
  for (const EnginePool::EngineView& e : pool_.engines())
    if (!e.stopping) loaded.push_back(e.model.id);
  nlohmann::json data = nlohmann::json::array();
  for (const PoolModel& m : pool_.local_models()) {
    nlohmann::json card = {{"id", m.id}, {"object", "model"}, {"created", 0}, {"owned_by", "kettle"}};
    if (const auto row = by_folder.find(canonical_folder(m.folder)); row != by_folder.end())
      for (const char* key : {"bytes", "arch", "parameters", "quantization", "context", "max_context", "fits", "error"})
        if (row->second->contains(key)) card[key] = (*row->second)[key];
    card["loaded"] = std::find(loaded.begin(), loaded.end(), m.id) != loaded.end();
    data.push_back(std::move(card));
  }
  ex.reply(json_reply(200, nlohmann::json({{"object", "list"}, {"data", data}}).dump()));
}

// A JSON body's top-level "model" (empty when there is none, or no pool routes by it).
std::string EngineProxy::requested_model(const http::Request& req) const {
  if (!pool_.route_by_model() || req.body.empty()) return "";
  const nlohmann::ordered_json body = read_json(req.body);  // ApiError 400, as the engine would answer
  if (!body.is_object()) return "";
  const auto it = body.find("model");
  return it != body.end() && it->is_string() ? it->get<std::string>() : "";
}

void EngineProxy::relay(http::Exchange& ex) {
  const http::Request& req = ex.request();
  const auto gone = [&ex] { return ex.client_gone(); };
  // A stored response (GET or DELETE /v1/responses/ID) lives in the engine that made it: a pool
  // asks its running engines, the most recently used first, until one has it.
  if (pool_.route_by_model() && req.path.rfind("/v1/responses/", 0) == 0) {
    std::vector<EnginePool::Lease> leases = pool_.running_leases();
    if (!leases.empty()) {
      for (size_t i = 0; i + 1 < leases.size(); ++i)
        if (relay_to(ex, leases[i], true)) return;
      relay_to(ex, leases.back(), false);  // the last one's answer, 404 included, is the reply
      return;
    }
  }
  relay_to(ex, pool_.acquire(requested_model(req), config_.ready_wait_seconds, gone), false);
}

bool EngineProxy::relay_to(http::Exchange& ex, const EnginePool::Lease& lease, bool skip_not_found) {
  const http::Request& req = ex.request();
  const auto gone = [&ex] { return ex.client_gone(); };
  const bool retryable = (req.method == "GET" || req.method == "HEAD") && req.body.empty();
  const std::string bytes = http::Upstream::serialize(req);
  EngineSupervisor& supervisor = lease.supervisor();
  constexpr int kRefusedAttempts = 40;  // 10 s of refused connections while the supervisor catches up
  int refused_attempts = 0;
  bool retried = false;
  for (;;) {
    // An engine asked only in passing is not waited for: one that is restarting holds no stored response.
    if (!supervisor.wait_ready(skip_not_found ? 0 : config_.ready_wait_seconds, gone)) {
      if (skip_not_found) return false;  // another engine may have it
      const EngineStatus s = supervisor.status();
      ex.reply(error_reply(
          engine_unavailable(503, fmt::format("the engine is {}{}", engine_state_name(s.state),
                                              s.last_exit.empty() ? "" : fmt::format(" (its last child: {})", s.last_exit))),
          req.path));
      return true;
    }
    std::string why;
    std::unique_ptr<http::Upstream> up = http::Upstream::connect(supervisor.socket(), why);
    http::Response head;
    if (up && up->send(bytes) && up->read_head(head, kNoTimeout, gone, req.method == "HEAD")) {
      if (skip_not_found && head.status == 404) return false;  // the connection closes unread
      if (up->sized() || req.method == "HEAD") {
        bool done = false;
        std::string piece;
        while (!done) {
          if (!up->read_body(piece, done, gone)) {
            ex.reply(error_reply(engine_unavailable(502, "the engine stopped while answering"), req.path));
            return true;
          }
          head.body += piece;
        }
        ex.reply(std::move(head));
        return true;
      }
      const bool events = is_event_stream(head);
      ex.start_stream(std::move(head));
      int64_t last_sequence = -1;
      for (;;) {
        bool done = false;
        std::string piece;
        if (!up->read_body(piece, done, gone)) {
          if (gone()) return true;  // the upstream connection closes here: the child cancels the generation
          if (events)
            ex.write(stream_error_event(req.path, engine_unavailable(502, "the engine stopped while answering"),
                                        last_sequence));
          if (events) ex.finish();
          return true;  // a stream that is not events is cut (the exchange closes the connection)
        }
        if (events && req.path == "/v1/responses") note_sequence(piece, last_sequence);
        if (!piece.empty() && !ex.write(piece)) return true;
        if (done) {
          ex.finish();
          return true;
        }
      }
    }
    if (gone()) return true;
    // A connection refused reached no engine (the child died a moment ago and the supervisor has not
    // seen it yet): any request waits for the next child. A request that was sent is tried again only
    // when it has no body and is a GET or HEAD, once.
    const bool unsent = !up && refused_attempts++ < kRefusedAttempts;
    if (!unsent && (!retryable || retried)) {
      if (skip_not_found) return false;
      ex.reply(error_reply(engine_unavailable(502, up ? "the engine stopped before answering"
                                                      : fmt::format("the engine cannot be reached ({})", why)),
                           req.path));
      return true;
    }
    if (!unsent) {
      retried = true;
      log::warn("engine: {} {} got no answer; trying once more", req.method, req.path);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the supervisor sees a dead child within 100 ms
  }
}

void EngineProxy::shutdown(double child_seconds) {
  draining_ = true;
  events_.drain();
  pool_.stop(child_seconds);  // each child drains its own requests, then exits
  {
    std::unique_lock lock(active_mutex_);
    active_changed_.wait_for(lock, std::chrono::seconds(5), [&] { return active_ == 0; });
  }
  events_.stop();
}

}  // namespace kettle::server
