// TensorParallelRunner: one model split over several ranks (issue 8), behind the
// same ModelRunner the engine drives. Each rank has its backend, its shard
// (model/tensor_parallel.h), its Collective and its Transformer; the ranks share
// one KvPool's block bookkeeping (each keeps its KV heads in its own buffers), so
// the engine's caches and prefix cache work unchanged. A call reserves the
// sequences' blocks once, runs every rank on its own thread in lockstep (their
// collectives meet in the middle), then advances the caches once; rank 0's
// logits and ids are the answer (every rank holds the same).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/collective.h"
#include "model/model_runner.h"
#include "model/tensor_parallel.h"

namespace kettle {

class Transformer;

class TensorParallelRunner final : public ModelRunner {
 public:
  // One backend per rank; `collectives[r]` is rank r's member of one group.
  TensorParallelRunner(const Model& model, std::vector<std::unique_ptr<Backend>> backends,
                       std::vector<std::unique_ptr<Collective>> collectives, KvPool::Options kv = {});
  ~TensorParallelRunner() override;

  int ranks() const { return static_cast<int>(backends_.size()); }
  const ModelSpec& spec() const override { return model_.spec; }
  KvPool& kv_pool() override { return *pool_; }

  void forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) override;
  int32_t forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) override;
  void forward_batch(const std::vector<BatchEntry>& entries, float* logits) override;
  void forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids) override;

 private:
  // Reserves the entries' blocks, runs step(rank) on every rank at once (rank 0 on this
  // thread), then advances the entries' lengths.
  void run(const std::vector<BatchEntry>& entries, const std::function<void(int)>& step);
  float* scratch_floats(int rank, size_t count);

  const Model& model_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Collective>> collectives_;
  std::vector<std::unique_ptr<ModelShard>> shards_;
  std::unique_ptr<KvPool> pool_;
  std::vector<std::unique_ptr<Transformer>> ranks_;
  std::vector<std::vector<float>> scratch_;  // ranks > 0: outputs nobody reads
};

}  // namespace kettle
