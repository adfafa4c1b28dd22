// EngineCore: the engine without its thread — the KV pool (made here and
// handed to the model runner), the prefix cache, the scheduler, and the step
// loop's body: admit, plan, run the plan through the runner as one batched
// forward, draw each entry's tokens (on the device when no entry needs its
// logits on the host), hand them to their sequences, retire the ended ones.
// `serve` runs it on the engine thread (engine.h); `generate`, `perplexity`,
// `bench --parallel` and the batching tests call step() themselves.
// Single-threaded.
#pragma once

#include <cstdint>
#include <array>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_load.h"
#include "engine/engine_options.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculation.h"
#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "tensor/host_buffer.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace kettle {

class EngineCore {
 public:
  // model, tokenizer (may be null: no text) and backends outlive the core; the backends
  // run every step: one, or one per tensor-parallel rank ([0] is where ids come back).
  EngineCore(const Model& model, const Tokenizer* tokenizer, const std::vector<Backend*>& backends,
             EngineOptions options);
  ~EngineCore();

  // Queues a generation; a request that can never run (a bad prompt or sampling field,
  // KV past the whole budget) ends at once on its sink with an error.
  void submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink);
  // Queues a saved sequence (Sequence::save) to go on where it stopped.
  void resume(const nlohmann::json& state, std::shared_ptr<GenerationSink> sink);
  // One step: admits, plans, runs, draws, retires. False when there was nothing to do.
  bool step();
  // Called with the load after a step's admissions and after its retirements, before the
  // ended generations' sinks hear of it: what a client does next already sees it done.
  void set_load_listener(std::function<void(const EngineLoad&)> listener) { load_listener_ = std::move(listener); }
  // Steps until every submitted generation has ended.
  void run_until_idle();
  bool idle() const { return scheduler_.idle(); }

  // Bytes admission counts for a sequence of `tokens` positions, and the budget they are
  // counted against (0: none): a request needing more can never run.
  size_t kv_bytes(int64_t tokens) const { return scheduler_.kv_bytes(tokens); }
  size_t kv_admission_capacity() const { return pool_->admission_capacity(); }
  size_t kv_budget_bytes() const { return pool_->max_bytes(); }

  int running() const { return scheduler_.running(); }
  int waiting() const { return scheduler_.waiting(); }
  EngineLoad load() const;
  // Drops the prefix-cache entries nobody holds (and every entry on disk); returns how many.
  int64_t clear_prefix_cache();
  // The disk tier (--ssd-cache), or null. Its calls are thread-safe.
  SsdTier* disk_tier() { return tier_.get(); }
  // While idle: cached blocks unused past --ssd-demote-idle leave memory for disk, and the
  // rest are written behind. Nothing without a disk tier.
  void housekeeping();
  // Hands every cached block not on disk to the tier (those whose write failed too);
  // returns how many cached blocks are not on disk yet.
  int64_t hand_cache_to_disk();
  // Something to run now (a waiting generation reading its prefix from disk is not).
  bool has_work() const { return scheduler_.has_work(); }
  // Every generation ends (cancelled, with `reason`) at the next step.
  void cancel_all(const std::string& reason) { scheduler_.cancel_all(reason); }
  // Ends every waiting generation with an error (`reason`).
  void drop_waiting(const std::string& reason);

  ModelRunner& runner() { return *runner_; }
  KvPool& pool() { return *pool_; }
  // The running sequences (a drafter sets their drafts between steps).
  Scheduler& scheduler() { return scheduler_; }
  // Drafting on or off from the next step (bench compares the two on one engine); off when
  // the engine has no drafter.
  void speculate(bool on) { speculating_ = on && drafter_ != nullptr; }

 private:
  void run(const StepPlan& plan);
  void run_drawing_on_device(const StepPlan& plan, int64_t rows);
  void run_drawing_on_host(const StepPlan& plan, int64_t rows);
  bool draws_on_device(const StepPlan& plan) const;
  void verify(const PlannedEntry& entry, const float* logits);
  void score_prompt(const PlannedEntry& entry, const float* logits);
  // An embedding's chunk: its hidden-state rows pooled into the sequence.
  void pool_rows(const PlannedEntry& entry, const float* hidden);
  void end(std::vector<std::unique_ptr<Sequence>> ended);
  // Constrained decoding: the token masks of a step whose row i is entry i's draw.
  const uint32_t* step_masks(const StepPlan& plan, int64_t rows);
  // One sequence's mask for its next draw (the host path), or nullptr when unconstrained.
  const uint32_t* host_mask(Sequence& seq);
  int64_t mask_words() const { return (vocab_ + 31) / 32; }
  void report_load();
  // A new generation's prefix blocks that are on disk and not in memory: read back first.
  void restore_prefix(Sequence& seq);
  // Puts the blocks read back since the last step into the prefix cache, and replays the
  // checkpoints read back into their waiting sequences.
  void take_restored();
  // --generation-checkpoint: a new generation's identity, and the checkpoint to resume from.
  void find_checkpoint(Sequence& seq);
  // After a step: the running generations due a checkpoint write one (blocks, then state).
  void checkpoint_running();
  // Before a step: drafts for the sequences about to decode (--draft-kind). Returns the seconds
  // spent on sequences' first drafts (a draft model's prefill of the prompt: once, not per step).
  double draft_running();
  // Times a step of decodes alone, or of verifies (drafting included) by its drafts in all:
  // their ratio is what a verify of so many drafts costs in plain decode steps (DraftState).
  void time_step(const StepPlan& plan, double seconds);
  double verify_cost(int64_t step_drafts) const;  // 0: not timed yet

  const Model& model_;
  const Tokenizer* tokenizer_;
  std::vector<Backend*> backends_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<SsdTier> tier_;              // null: no disk tier; outlives the cache
  std::unique_ptr<PrefixCache> prefix_cache_;  // null: off
  struct PendingRestore {
    std::vector<int32_t> prompt;
    uint64_t scope = 0;
    size_t first = 0;  // the block the restored ones start at
    int64_t worst_blocks = 0;  // the generation's whole KV (prompt and max_tokens), in blocks
  };
  std::map<int64_t, PendingRestore> restores_;  // by ticket
  double demote_idle_seconds_ = 0.0;
  int64_t checkpoint_every_ = 0;
  std::set<int64_t> checkpoint_loads_;  // tickets of checkpoints being read
  Scheduler scheduler_;
  std::unique_ptr<Drafter> drafter_;  // null: no speculation
  bool speculating_ = false;
  static constexpr int64_t kTimedDrafts = 64;  // verify steps of more drafts share the last slot
  double decode_step_seconds_ = 0.0;           // moving averages
  std::array<double, kTimedDrafts + 1> verify_step_seconds_{};  // by the step's drafts in all
  int64_t step_drafts_ = 0;                    // the running step's drafts in all
  SpeculationLoad speculation_;       // the drafter's kind and totals
  int64_t vocab_;
  std::string kv_quant_name_;  // --kv-quant's spelling, for /stats
  int64_t width_;  // a step's output row: vocab_ logits, or an embedding model's hidden state
  StepPlan plan_;  // the step's, its storage reused
  std::vector<BatchEntry> entries_;
  HostBuffer<float> logits_;  // [rows, width_]
  std::vector<SampleRow> sample_rows_;
  std::vector<int32_t> ids_;
  std::vector<uint32_t> masks_;                // [rows, mask_words()] the step's token masks
  std::unique_ptr<ThreadPool> mask_threads_;   // made on the first constrained step
  std::function<void(const EngineLoad&)> load_listener_;
};

// One generation through a core of its own making or a given one, collected: the ids
// drawn (the end-of-sequence id included when it ended one), and the end report.
struct GenerationResult {
  std::vector<int32_t> tokens;
  GenerationEnd end;
};
GenerationResult generate(EngineCore& core, GenerationRequest request,
                          const std::function<void(const GenerationOutput&)>& on_output = {});

}  // namespace kettle
