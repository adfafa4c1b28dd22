// The engine thread: requests, cancellations and flushes arrive through a
// mutex-guarded inbox from any thread; only this thread touches the core (the
// runner, the pool, the prefix cache), so no lock is ever held across a step.
#include "engine/engine.h"

#include <condition_variable>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kettle {

struct Engine::Impl {
  Impl(const Model& model, const Tokenizer& tokenizer, std::vector<std::unique_ptr<Backend>> owned, EngineOptions options)
      : backends(std::move(owned)),
        core(model, &tokenizer, backend_pointers(backends), options),
        kv_capacity(core.kv_admission_capacity()),
        kv_budget(core.kv_budget_bytes()),
        published(core.load()) {
    core.set_load_listener([this](const EngineLoad& load) { publish(load); });
    if (SsdTier* tier = core.disk_tier())
      tier->set_restore_listener([this] {
        std::lock_guard lock(mutex);
        restored = true;
        wake.notify_one();
      });
    thread = std::thread([this] { loop(); });
  }

  void loop();
  void publish(EngineLoad load) {
    std::lock_guard lock(mutex);
    load.queued += static_cast<int>(inbox.size());
    published = load;
  }

  struct Submission {
    GenerationRequest request;
    std::shared_ptr<GenerationSink> sink;
  };

  std::vector<std::unique_ptr<Backend>> backends;  // before the core, which runs on them
  EngineCore core;                                 // the engine thread's alone
  const size_t kv_capacity, kv_budget;             // fixed once the pool is made
  mutable std::mutex mutex;                        // guards what follows
  std::condition_variable wake;
  std::deque<Submission> inbox;
  std::vector<std::promise<int64_t>> flushes;    // clear the cache
  std::vector<std::promise<int64_t>> hand_offs;  // hand the cache to disk
  bool restored = false;                          // a disk read is ready to take
  std::string cancel_reason;
  bool cancel = false, stopping = false;
  EngineLoad published;
  std::thread thread;
};

void Engine::Impl::loop() {
  for (;;) {
    std::deque<Submission> arrived;
    std::vector<std::promise<int64_t>> flush, hand_off;
    bool cancel_now = false, stop_now = false;
    std::string reason;
    {
      std::unique_lock lock(mutex);
      auto ready = [&] {
        return stopping || cancel || restored || !inbox.empty() || !flushes.empty() || !hand_offs.empty() || core.has_work();
      };
      if (!ready() && core.disk_tier()) {  // idle: demote and write behind, then look again within a second
        lock.unlock();
        core.housekeeping();
        lock.lock();
        wake.wait_for(lock, std::chrono::seconds(1), ready);
      } else {
        wake.wait(lock, ready);
      }
      restored = false;
      arrived.swap(inbox);
      flush.swap(flushes);
      hand_off.swap(hand_offs);
      std::swap(cancel_now, cancel);
      reason = cancel_reason;
      stop_now = stopping;
    }
    for (Submission& s : arrived) core.submit(std::move(s.request), std::move(s.sink));
    if (cancel_now) core.cancel_all(reason);
    for (auto& done : flush) {
      const int64_t dropped = core.clear_prefix_cache();
      publish(core.load());  // the flushing client's next /stats sees the cache empty
      done.set_value(dropped);
    }
    for (auto& done : hand_off) done.set_value(core.hand_cache_to_disk());
    if (stop_now) core.drop_waiting("the server is shutting down");
    if (stop_now && core.idle()) break;
    core.step();  // publishes through the load listener
  }
  std::lock_guard lock(mutex);
  published = core.load();
}

Engine::Engine(const Model& model, const Tokenizer& tokenizer, std::vector<std::unique_ptr<Backend>> backends,
               EngineOptions options)
    : impl_(std::make_unique<Impl>(model, tokenizer, std::move(backends), options)) {}

Engine::~Engine() { stop(); }

void Engine::submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->stopping) {
      impl_->inbox.push_back({std::move(request), std::move(sink)});
      ++impl_->published.queued;
      impl_->wake.notify_one();
      return;
    }
  }
  GenerationEnd end;
  end.finish_reason = "error";
  end.error = "the server is shutting down";
  sink->on_end(end);
}

EngineLoad Engine::load() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->published;
}

int64_t Engine::clear_prefix_cache() {
  std::future<int64_t> done;
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->thread.joinable() || impl_->stopping) return 0;
    impl_->flushes.emplace_back();
    done = impl_->flushes.back().get_future();
    impl_->wake.notify_one();
  }
  return done.get();
}

// Asks the engine thread to hand the cache to disk; returns how many cached blocks are not on
// disk yet (-1: the engine has stopped).
int64_t Engine::hand_cache_to_disk() {
  std::future<int64_t> done;
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->thread.joinable()) return -1;
    impl_->hand_offs.emplace_back();
    done = impl_->hand_offs.back().get_future();
    impl_->wake.notify_one();
  }
  return done.get();
}

CacheFlushReport Engine::flush_cache_to_disk(double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_seconds));
  SsdTier* tier = impl_->core.disk_tier();  // made with the core; its calls are thread-safe
  CacheFlushReport report;
  // Rounds of hand over, wait for the writes; until nothing is left, the time is up, or a
  // round makes no progress (the disk refuses, or its cap evicts what was just written).
  // The queue drains at least once: a checkpoint's removal is queued too, and a flushed
  // disk shows every finished generation's checkpoint gone.
  int64_t before = INT64_MAX;
  for (;;) {
    report.not_on_disk = hand_cache_to_disk();
    if (tier == nullptr || !tier->wait_written(deadline)) break;
    if (report.not_on_disk <= 0 || report.not_on_disk >= before) break;
    before = report.not_on_disk;
  }
  if (tier) {
    const SsdStats s = tier->stats();
    report.queued = s.queued;
    report.written = s.written;
    report.dropped = s.dropped;
    report.errors = s.errors;
    report.spilling = s.spilling;
  }
  report.durable = report.not_on_disk == 0;
  return report;
}

size_t Engine::kv_bytes(int64_t tokens) const { return impl_->core.kv_bytes(tokens); }  // layout arithmetic only
size_t Engine::kv_admission_capacity() const { return impl_->kv_capacity; }
size_t Engine::kv_budget_bytes() const { return impl_->kv_budget; }

void Engine::cancel_all(const std::string& reason) {
  std::lock_guard lock(impl_->mutex);
  impl_->cancel = true;
  impl_->cancel_reason = reason;
  impl_->wake.notify_one();
}

void Engine::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The disk tier's reads may end after this: they no longer wake a thread that is gone.
  if (SsdTier* tier = impl_->core.disk_tier()) tier->set_restore_listener({});
}

}  // namespace kettle
