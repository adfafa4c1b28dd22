#include "server/engine_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "server/api_error.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::server {
namespace {

constexpr auto kListingLifetime = std::chrono::seconds(2);  // a request's lookup re-reads the disk at most this often
constexpr auto kPoll = std::chrono::milliseconds(100);

}  // namespace

std::string canonical_folder(const std::string& folder) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(folder, ec);
  return ec ? folder : p.string();
}

EnginePool::Lease::~Lease() {
  if (pool_ && engine_) pool_->release(*engine_);
}

EnginePool::EnginePool(PoolConfig config) : config_(std::move(config)) {
  config_.default_model.folder = canonical_folder(config_.default_model.folder);
}

EnginePool::~EnginePool() { stop(5); }

void EnginePool::start() {
  std::lock_guard lock(mutex_);
  launch(config_.default_model);
}

std::shared_ptr<PoolEngine> EnginePool::launch(const PoolModel& model) {
  const std::string socket = fmt::format("{}/engine-{}.sock", config_.socket_dir, ++sockets_made_);
  auto engine = std::make_shared<PoolEngine>();
  engine->model = model;
  engine->supervisor = std::make_unique<EngineSupervisor>(config_.command(model, socket), socket);
  engine->last_used = Clock::now();
  engine->supervisor->start();
  engines_.push_back(engine);
  log::info("engine pool: starting an engine for {} ({} of {})", model.id, engines_.size(), config_.capacity);
  return engine;
}

void EnginePool::release(PoolEngine& engine) {
  {
    std::lock_guard lock(mutex_);
    --engine.active;
    engine.last_used = Clock::now();
  }
  changed_.notify_all();
}

std::vector<PoolModel> EnginePool::local_models() {
  std::lock_guard lock(listing_mutex_);
  const auto now = Clock::now();
  if (listing_.empty() || now - listed_at_ > kListingLifetime) {
    listing_ = {config_.default_model};
    for (PoolModel& m : config_.list_models ? config_.list_models() : std::vector<PoolModel>{})
      if (canonical_folder(m.folder) != config_.default_model.folder) listing_.push_back(std::move(m));
    listed_at_ = now;
  }
  return listing_;
}

PoolModel EnginePool::resolve(const std::string& name) {
  if (!config_.route_by_model || name.empty()) return config_.default_model;
  try {
    PoolModel m = config_.find_model(local_models(), name);
    m.folder = canonical_folder(m.folder);
    return m;
  } catch (const Error& e) {
    if (e.category() == ErrorCategory::kNotFound) throw ApiError(404, e.what(), "model", "model_not_found");
    throw ApiError(400, e.what(), "model");
  }
}

bool EnginePool::is_down(const PoolEngine& e) { return e.supervisor->status().state == EngineState::kDown; }

// Of the engines no request holds, one that is down (its model failed to load: it only holds a
// slot), else the least recently used; none when every engine is held or stopping.
std::shared_ptr<PoolEngine> EnginePool::engine_to_evict() const {
  std::shared_ptr<PoolEngine> pick;
  bool pick_down = false;
  for (const auto& e : engines_) {
    if (e->stopping || e->active > 0) continue;
    const bool down = is_down(*e);
    if (!pick || (down && !pick_down) || (down == pick_down && e->last_used < pick->last_used)) {
      pick = e;
      pick_down = down;
    }
  }
  return pick;
}

EnginePool::Lease EnginePool::acquire(const std::string& name, double wait_seconds,
                                      const std::function<bool()>& cancelled) {
  const PoolModel model = resolve(name);
  const auto deadline = Clock::now() + std::chrono::duration<double>(wait_seconds);
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopped_) throw ApiError(503, "the server is shutting down", "", "engine_unavailable");
    const auto same = std::find_if(engines_.begin(), engines_.end(),
                                   [&](const auto& e) { return e->model.folder == model.folder; });
    if (same != engines_.end() && !(*same)->stopping) {
      ++(*same)->active;
      (*same)->last_used = Clock::now();
      return Lease(this, *same);
    }
    // The same model still stopping holds its disk tier and its memory: wait for it to go.
    if (same == engines_.end() && static_cast<int>(engines_.size()) < config_.capacity) {
      std::shared_ptr<PoolEngine> engine = launch(model);
      ++engine->active;
      return Lease(this, engine);
    }
    std::shared_ptr<PoolEngine> idle = same == engines_.end() ? engine_to_evict() : nullptr;
    if (idle) {
      idle->stopping = true;
      log::info("engine pool: stopping {} ({}) to load {}", idle->model.id,
                is_down(*idle) ? "down" : "least recently used", model.id);
      lock.unlock();
      idle->supervisor->stop(config_.stop_seconds);
      lock.lock();
      std::erase(engines_, idle);
      changed_.notify_all();
      continue;
    }
    if (Clock::now() >= deadline || (cancelled && cancelled()))
      throw ApiError(503,
                     fmt::format("every engine of the pool ({}) is busy with other models' requests; retry shortly",
                                 config_.capacity),
                     "", "engine_unavailable");
    changed_.wait_for(lock, kPoll);
  }
}

std::vector<EnginePool::Lease> EnginePool::running_leases() {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<PoolEngine>> live;
  for (const auto& e : engines_)
    if (!e->stopping) live.push_back(e);
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a->last_used > b->last_used; });
  std::vector<Lease> leases;
  for (const auto& e : live) {
    ++e->active;
    leases.emplace_back(this, e);
  }
  return leases;
}

std::vector<EnginePool::EngineView> EnginePool::engines() const {
  std::lock_guard lock(mutex_);
  std::vector<EngineView> out;
  for (const auto& e : engines_) out.push_back({e->model, e->supervisor->status(), e->active, e->stopping});
  return out;
}

void EnginePool::stop(double seconds) {
  std::vector<std::shared_ptr<PoolEngine>> running;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    running = engines_;
  }
  changed_.notify_all();
  std::vector<std::thread> stoppers;  // every engine drains at once
  for (const auto& e : running) stoppers.emplace_back([&e, seconds] { e->supervisor->stop(seconds); });
  for (std::thread& t : stoppers) t.join();
}

}  // namespace kettle::server
