// The engine thread: requests, cancellations and flushes arrive through a
// mutex-guarded inbox from any thread; only this thread touches the core (the
// runner, the pool, the prefix cache), so no lock is ever held across a step.
#include "engine/engine.h"

#include <condition_variable>
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
  std::vector<std::promise<int64_t>> flushes;
  std::string cancel_reason;
  bool cancel = false, stopping = false;
  EngineLoad published;
  std::thread thread;
};

void Engine::Impl::loop() {
  for (;;) {
    std::deque<Submission> arrived;
    std::vector<std::promise<int64_t>> flush;
    bool cancel_now = false, stop_now = false;
    std::string reason;
    {
      std::unique_lock lock(mutex);
      wake.wait(lock, [&] { return stopping || cancel || !inbox.empty() || !flushes.empty() || !core.idle(); });
      arrived.swap(inbox);
      flush.swap(flushes);
      std::swap(cancel_now, cancel);
      reason = cancel_reason;
      stop_now = stopping;
    }
    for (Submission& s : arrived) core.submit(std::move(s.request), std::move(s.sink));
    if (cancel_now) core.cancel_all(reason);
    for (auto& done : flush) {
      const int64_t dropped = core.flush_prefix_cache();
      publish(core.load());  // the flushing client's next /stats sees the cache empty
      done.set_value(dropped);
    }
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

int64_t Engine::flush_prefix_cache() {
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
}

}  // namespace kettle
