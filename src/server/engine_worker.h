// EngineWorker: the one thread that owns the model runner and the KV caches.
// It runs up to `batch` generations at once (continuous batching): queued Jobs
// join between steps (the longest cached prefix reused); each step is one
// batched forward in which every decoding sequence advances one token and
// joining sequences prefill up to `prefill_chunk` prompt tokens in all, so a
// long prompt never stalls the running streams; a finished one leaves at once. Each reports
// through its job's EventChannel; HTTP threads never touch the model.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "model/rope_config.h"
#include "server/metrics.h"
#include "server/request_channel.h"
#include "tensor/host_buffer.h"
#include "tokenizer/tokenizer.h"

namespace kettle::server {

class EngineWorker {
 public:
  struct Options {
    int batch = 8;                     // sequences decoded together; 1: strictly one at a time
    int64_t prefill_chunk = 2048;      // prompt tokens prefilled per step, beside the running decodes
    size_t kv_budget_bytes = 0;        // the KV pool's cap: running sequences' worst case (prompt + max_tokens
                                       // each) past it waits; 0: on a GPU 90 % of the memory left after the
                                       // weights, elsewhere no cap
    size_t prompt_cache_bytes = 0;     // the prefix cache's cap (inside the pool); 0: off
    int kv_block_size = KvPool::kDefaultBlockSize;  // tokens per KV block (and per cached prefix block)
  };
  // model and tokenizer must outlive the worker; the backends run every generation: one,
  // or one per rank of a model split by tensor parallelism.
  EngineWorker(const Model& model, const Tokenizer& tokenizer, std::vector<std::unique_ptr<Backend>> backends,
               Options options);
  ~EngineWorker();

  void submit(Job job);
  // Generations running and waiting now, and the prefix cache's counters.
  EngineLoad load();
  // Empties the prefix cache (POST /admin/cache/flush); returns the entries dropped.
  int64_t flush_prefix_cache();
  // KV bytes admission counts for a sequence of `tokens` positions (whole blocks, per rank).
  size_t kv_bytes(int64_t tokens) const;
  // The KV pool's cap (0: none), and the part of it kv_bytes are counted against: a
  // request whose kv_bytes exceed that can never run.
  size_t kv_budget_bytes() const { return kv_budget_bytes_; }
  size_t kv_admission_capacity() const;
  // Cancels the running jobs (each with an error event) and every queued one.
  void cancel_all(const std::string& reason);
  // Finishes the running jobs, fails the queued ones, joins the thread.
  void stop();

 private:
  struct Sequence;

  void loop();
  std::vector<Job> take_jobs(bool block);
  std::unique_ptr<Sequence> start(Job job);
  void step(std::vector<std::unique_ptr<Sequence>>& active);
  void run_entries();
  bool completes_prompt(const Sequence& seq, int64_t n) const;
  void publish_kv_stats();
  void accept(Sequence& seq, const SampledToken& sampled);
  void finish(Sequence& seq);
  void release(const std::shared_ptr<EventChannel>& channel, size_t kv_reserved);
  void emit(Sequence& seq, std::string text, std::vector<TokenLogprob> logprobs = {});

  const Model& model_;
  const Tokenizer& tokenizer_;
  std::vector<std::unique_ptr<Backend>> backends_;  // [0]: where logits and ids come back
  std::unique_ptr<ModelRunner> runner_;
  int batch_;
  int64_t prefill_chunk_;
  HostBuffer<float> logits_;  // [batch, vocab]
  std::vector<BatchEntry> entries_;  // the step's inputs, and the sequences they belong to
  std::vector<Sequence*> stepped_;
  std::vector<SampledToken> sampled_;  // the step's token per entry
  std::vector<SampleRow> sample_rows_;
  std::vector<int32_t> ids_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::vector<std::shared_ptr<EventChannel>> running_;
  size_t kv_budget_bytes_;
  size_t kv_bytes_in_use_ = 0;  // reserved by the running sequences (under mutex_)
  KvPoolStats kv_stats_;        // under mutex_
  std::optional<PrefixCache> prefix_cache_;  // used under mutex_ (the engine thread, and load() for stats)
  void remember_prefix(const Sequence& seq, int64_t tokens);
  std::string cancel_reason_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kettle::server
