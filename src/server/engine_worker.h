// EngineWorker: the one thread that owns the Transformer and its KV cache. It
// runs queued Jobs in FIFO order, one at a time, and reports each through the
// job's EventChannel; HTTP threads never touch the model.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "model/transformer.h"
#include "server/metrics.h"
#include "server/request_channel.h"
#include "tokenizer/tokenizer.h"

namespace kettle::server {

class EngineWorker {
 public:
  struct Options {
    size_t prompt_cache_bytes = 0;     // the prefix cache's cap; 0: off
    int64_t prompt_cache_block = 16;   // tokens a cached prefix is matched in
  };
  // model and tokenizer must outlive the worker; the backend runs every generation.
  EngineWorker(const Model& model, const Tokenizer& tokenizer, std::unique_ptr<Backend> backend, Options options);
  ~EngineWorker();

  void submit(Job job);
  // Generations running and waiting now.
  EngineLoad load();
  // Cancels the running job (with an error event) and every queued one.
  void cancel_all(const std::string& reason);
  // Finishes the running job, fails the queued ones, joins the thread.
  void stop();

 private:
  void loop();
  void run(Job& job);

  const Model& model_;
  const Tokenizer& tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> transformer_;
  std::optional<PrefixCache> prefix_cache_;  // used under mutex_ (the engine thread, and load() for stats)
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::shared_ptr<EventChannel> running_;
  std::string cancel_reason_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kettle::server
