// TensorParallelRunner: one model split over several ranks (issue 8), behind the
// same ModelRunner the engine drives. Each rank has its backend, its shard
// (model/tensor_parallel.h), its Collective and its DecoderRunner; the ranks share
// one KvPool's block bookkeeping (each keeps its KV heads in its own buffers), so
// the engine's caches and prefix cache work unchanged. A call reserves the
// sequences' blocks once, runs every rank on its own thread in lockstep (their
// collectives meet in the middle; rank r always on the same thread, rank 0 on
// the caller's), then advances the caches once; rank 0's
// logits and ids are the answer (every rank holds the same). Host ranks meet
// through a HostGroup; GPU ranks will meet through NCCL, not built yet.
//
// A rank that fails mid-step aborts the group: the others throw out of their
// collectives instead of waiting, the call reports the first rank's error, and
// the next call runs normally.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "backend/cpu/host_collective.h"
#include "model/model_runner.h"
#include "model/tensor_parallel.h"
#include "util/thread_pool.h"

namespace kettle {

class DecoderRunner;

class TensorParallelRunner final : public ModelRunner {
 public:
  // One backend per rank (not owned). Throws kettle::Error (kUnsupported) when the model
  // does not split that many ways, or the backends are GPUs.
  TensorParallelRunner(const Model& model, const std::vector<Backend*>& backends, KvPool& pool);
  ~TensorParallelRunner() override;

  int ranks() const { return static_cast<int>(backends_.size()); }
  const ModelSpec& spec() const override { return model_.spec; }
  KvPool& kv_pool() override { return pool_; }

  void forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) override;
  int32_t forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) override;
  void forward_batch(const std::vector<BatchEntry>& entries, float* logits) override;
  void forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids,
                     const MaskSource& masks = {}) override;

 private:
  // Reserves the entries' blocks, runs step(rank) on every rank at once (rank 0 on this
  // thread), then advances the entries' lengths.
  void run(const std::vector<BatchEntry>& entries, const std::function<void(int)>& step);
  // Rank r's (r > 0) buffers for outputs only rank 0's copy of is returned.
  float* scratch_floats(int rank, size_t count);
  int32_t* scratch_ids(int rank, size_t count);

  const Model& model_;
  std::vector<Backend*> backends_;
  KvPool& pool_;  // one rank's share of the KV heads in each rank's buffers
  std::unique_ptr<HostGroup> group_;
  std::vector<std::unique_ptr<Collective>> collectives_;
  std::vector<std::unique_ptr<ModelShard>> shards_;
  std::vector<std::unique_ptr<DecoderRunner>> ranks_;
  std::vector<std::vector<float>> scratch_;     // ranks > 0: logits nobody reads
  std::vector<std::vector<int32_t>> scratch_ids_;  // ranks > 0: sampled ids nobody reads
  ThreadPool rank_threads_;                   // thread r runs rank r; last: joined first
};

}  // namespace kettle
