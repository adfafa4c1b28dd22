// EngineProxy: the HTTP side of `serve --isolate`'s (and --model-pool's) parent.
// It binds the port and relays every request to an engine child of its pool on
// the child's unix socket (upstream.h) — whole responses whole, streams piece by
// piece as they come — answering only /health and GET /engine itself (and, with
// a model pool, GET /v1/models: every local model). With a model pool, a
// request's JSON body's `model` picks the engine (engine_pool.h). The child sees the client's address
// (forwarded_peer) and applies every access rule itself. A client that leaves
// closes its upstream connection, so the child cancels its generation. While
// the child restarts, requests wait for the new one (the client may leave);
// when the child dies under a request, the request gets 502 engine_unavailable
// (a stream: an error event in its API's shape), and a bodyless GET or HEAD that
// got no answer is tried once more. A request whose connection was refused reached
// no engine (the child just died): it waits for the next child, whatever its method.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "server/access_policy.h"
#include "server/engine_pool.h"
#include "server/http/event_server.h"
#include "server/http/worker_pool.h"

namespace kettle::server {

struct ProxyConfig {
  AccessConfig access;    // GET /engine's rules (the child checks the relayed routes)
  http::ServerLimits http;
  int workers = 128;      // requests relayed at once; past it, 503
  double ready_wait_seconds = 600;  // a request waits this long for a starting child
  // With a model pool: GET /v1/models's rows (kettle ls --json's), each as the OpenAI model object's extras.
  std::function<nlohmann::json()> local_model_rows;
};

class EngineProxy {
 public:
  EngineProxy(ProxyConfig config, EnginePool& pool);
  ~EngineProxy();

  void bind(const std::string& host, int port) { events_.bind(host, port); }
  void bind_unix(const std::string& path) { events_.bind_unix(path); }
  int port() const { return events_.port(); }
  void listen() { events_.run(); }
  // No new connections; every child is sent SIGTERM and drains its requests (up to
  // child_seconds, then it is killed); then the listener stops.
  void shutdown(double child_seconds);

 private:
  void route(const std::shared_ptr<http::Exchange>& exchange);
  void answer_health(http::Exchange& exchange);
  void answer_engine(http::Exchange& exchange);
  void answer_models(http::Exchange& exchange);
  bool allowed(http::Exchange& exchange);  // the site and key rules of the routes answered here
  void relay(http::Exchange& exchange);
  // Relays to the engine `lease` holds. skip_not_found: an engine's 404 is not replied (returns
  // false: the caller asks another engine).
  bool relay_to(http::Exchange& exchange, const EnginePool::Lease& lease, bool skip_not_found);
  std::string requested_model(const http::Request& request) const;

  ProxyConfig config_;
  EnginePool& pool_;
  AccessPolicy access_;
  http::EventServer events_;
  http::WorkerPool workers_;
  std::mutex active_mutex_;
  std::condition_variable active_changed_;
  int active_ = 0;
  std::atomic<bool> draining_{false};
};

}  // namespace kettle::server
