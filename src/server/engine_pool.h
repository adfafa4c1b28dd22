// EnginePool: the engine children of `serve --isolate` and `serve --model-pool N`.
// With --isolate alone the pool holds one engine, the command line's model, and
// every request goes to it whatever its `model` field says. With --model-pool N,
// a request's `model` (a local model's id exactly, else the one id containing it;
// none: the command line's model) picks the engine: one already running, else
// one started for it — after an engine that no request holds is stopped (one
// that is down first, its model having failed to load, else the least recently
// used; it drains, its prefix cache going to the disk tier when one is
// configured) if N are running. While every engine is busy, a request for
// another model waits for one to be free, and gives up with 503 after a while.
// A model is looked up only among the local models (the hub cache and
// --models-dir, as the cli lists them), never as a path a client names.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/engine_supervisor.h"

namespace kettle::server {

// A model an engine serves: its id as requests name it, and its folder.
struct PoolModel {
  std::string id;
  std::string folder;
};

// A folder's canonical path (as given when it has none): how the pool tells two names of one model apart.
std::string canonical_folder(const std::string& folder);

struct PoolConfig {
  int capacity = 1;              // engines running at once
  bool route_by_model = false;   // --model-pool: a request's `model` picks the engine
  PoolModel default_model;       // the command line's model
  // Every local model (the registry: cli reads it), and the one of them a request's name means
  // (throws kettle::Error: kNotFound, or kInvalidArgument when ambiguous).
  std::function<std::vector<PoolModel>()> list_models;
  std::function<PoolModel(const std::vector<PoolModel>& models, const std::string& name)> find_model;
  std::string socket_dir;        // private folder for the engines' sockets
  // The child's command line serving `model` on `socket`.
  std::function<std::vector<std::string>(const PoolModel& model, const std::string& socket)> command;
  double stop_seconds = 30;      // an evicted engine's drain (and disk-tier write), then it is killed
};

// One engine of the pool.
struct PoolEngine {
  PoolModel model;
  std::unique_ptr<EngineSupervisor> supervisor;
  int active = 0;                                  // requests holding it
  std::chrono::steady_clock::time_point last_used{};
  bool stopping = false;                           // being evicted
};

class EnginePool {
 public:
  explicit EnginePool(PoolConfig config);
  ~EnginePool();  // stops every engine

  // A request's hold on an engine: while held, the engine is not evicted.
  class Lease {
   public:
    Lease(EnginePool* pool, std::shared_ptr<PoolEngine> engine) : pool_(pool), engine_(std::move(engine)) {}
    Lease(Lease&& other) noexcept : pool_(other.pool_), engine_(std::move(other.engine_)) { other.pool_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    EngineSupervisor& supervisor() const { return *engine_->supervisor; }

   private:
    EnginePool* pool_;
    std::shared_ptr<PoolEngine> engine_;
  };

  // Starts the command line's model's engine.
  void start();
  // The engine for a request naming `model` (empty: the command line's), started on demand.
  // Throws ApiError: 404 model_not_found (no local model of that name), 400 (ambiguous), 503
  // (every engine busy for `wait_seconds`, the pool stopping, or cancelled() said so).
  Lease acquire(const std::string& model, double wait_seconds, const std::function<bool()>& cancelled);
  // Leases on every running engine, the most recently used first (none are started).
  std::vector<Lease> running_leases();
  bool route_by_model() const { return config_.route_by_model; }
  int capacity() const { return config_.capacity; }

  struct EngineView {
    PoolModel model;
    EngineStatus status;
    int active = 0;
    bool stopping = false;
  };
  std::vector<EngineView> engines() const;
  // Every local model a request may name (the command line's first), re-read at most every few seconds.
  std::vector<PoolModel> local_models();
  // No new engines; each running one is stopped (drained, up to `seconds`).
  void stop(double seconds);

 private:
  using Clock = std::chrono::steady_clock;
  PoolModel resolve(const std::string& name);
  std::shared_ptr<PoolEngine> launch(const PoolModel& model);  // under mutex_
  std::shared_ptr<PoolEngine> engine_to_evict() const;         // under mutex_
  static bool is_down(const PoolEngine& e);
  void release(PoolEngine& engine);

  PoolConfig config_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::shared_ptr<PoolEngine>> engines_;
  int sockets_made_ = 0;
  bool stopped_ = false;
  std::mutex listing_mutex_;
  std::vector<PoolModel> listing_;
  Clock::time_point listed_at_{};
};

}  // namespace kettle::server
