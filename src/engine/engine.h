// Engine: the one thread that owns the model runner, the KV store and the
// scheduler (an EngineCore), behind the narrow interface the server talks
// through — submit a request with its sink, read the load, flush the prefix
// cache, cancel, stop. Nothing of the model or the KV store shows here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_load.h"
#include "engine/engine_options.h"
#include "engine/request.h"

namespace kettle {

class Backend;
class Tokenizer;
struct Model;

class Engine {
 public:
  // model and tokenizer outlive the engine; the backends run every step (one, or one per
  // tensor-parallel rank).
  Engine(const Model& model, const Tokenizer& tokenizer, std::vector<std::unique_ptr<Backend>> backends,
         EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a generation; its sink hears from the engine thread. After stop(): ends at
  // once with an error.
  void submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink);
  // Generations running and waiting, the KV pool and the prefix cache (refreshed after
  // every step).
  EngineLoad load() const;
  // Drops the prefix-cache entries no running generation holds, and every entry of its
  // disk tier; returns how many.
  int64_t clear_prefix_cache();
  // The durability barrier: hands every cached block not on disk to the disk tier and
  // waits (up to `timeout_seconds`) until they are written. Without a disk tier nothing
  // is durable (unless the cache is empty).
  CacheFlushReport flush_cache_to_disk(double timeout_seconds);
  // KV bytes admission counts for `tokens` positions, and the budget they are counted
  // against (0: none): a request needing more can never run.
  size_t kv_bytes(int64_t tokens) const;
  size_t kv_admission_capacity() const;
  size_t kv_budget_bytes() const;
  // Every running and waiting generation ends, cancelled with `reason`.
  void cancel_all(const std::string& reason);
  // Finishes the running generations, fails the waiting ones, joins the thread.
  void stop();

 private:
  int64_t hand_cache_to_disk();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kettle
