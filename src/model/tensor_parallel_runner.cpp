#include "model/tensor_parallel_runner.h"

#include <atomic>
#include <exception>

#include "model/decoder_runner.h"
#include "util/error.h"

namespace kettle {

TensorParallelRunner::TensorParallelRunner(const Model& model, const std::vector<Backend*>& backends, KvPool& pool)
    : model_(model), backends_(backends), pool_(pool), rank_threads_(static_cast<int>(backends.size())) {
  const int n = ranks();
  check_splittable(model.spec, n);
  for (Backend* b : backends_)
    if (!b->host_memory())
      fail(ErrorCategory::kUnsupported,
           "--tensor-parallel {} on {}: GPU ranks need the NCCL collective, which kettle does not build yet", n, b->name());
  group_ = std::make_unique<HostGroup>(n);
  for (int r = 0; r < n; ++r) {
    collectives_.push_back(group_->member(r));
    shards_.push_back(std::make_unique<ModelShard>(shard_model(model, r, n)));
  }
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    ranks_.push_back(std::make_unique<DecoderRunner>(shards_[i]->model, *backends_[i], pool_,
                                                   tensor_parallel_of(*shards_[i], *collectives_[i], true)));
  }
  scratch_.resize(static_cast<size_t>(n));
  scratch_ids_.resize(static_cast<size_t>(n));
}

TensorParallelRunner::~TensorParallelRunner() = default;

float* TensorParallelRunner::scratch_floats(int rank, size_t count) {
  std::vector<float>& s = scratch_[static_cast<size_t>(rank)];
  if (s.size() < count) s.resize(count);
  return s.data();
}

int32_t* TensorParallelRunner::scratch_ids(int rank, size_t count) {
  std::vector<int32_t>& s = scratch_ids_[static_cast<size_t>(rank)];
  if (s.size() < count) s.resize(count);
  return s.data();
}

void TensorParallelRunner::run(const std::vector<BatchEntry>& entries, const std::function<void(int)>& step) {
  reserve_caches(entries);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks()));
  // A rank that fails aborts the group, so the others leave their collectives too; the
  // first rank's own error is what the caller sees, and the group is usable again after.
  std::atomic<int> first_failed{-1};
  const auto guarded = [&](int r) {
    try {
      step(r);
    } catch (...) {
      errors[static_cast<size_t>(r)] = std::current_exception();
      int none = -1;
      first_failed.compare_exchange_strong(none, r);
      group_->abort();
    }
  };
  rank_threads_.run([&](int r, int) { guarded(r); });
  if (first_failed >= 0) {
    group_->reset();
    std::rethrow_exception(errors[static_cast<size_t>(first_failed.load())]);
  }
  advance_caches(entries);
}

void TensorParallelRunner::forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) {
  const size_t count = static_cast<size_t>((which == LogitsFor::kAllTokens ? n : 1) * model_.spec.vocab_size);
  std::vector<BatchEntry> entries{{tokens, n, &kv}};
  run(entries, [&](int r) {
    ranks_[static_cast<size_t>(r)]->forward(tokens, n, kv, which, r == 0 ? logits : scratch_floats(r, count));
  });
}

int32_t TensorParallelRunner::forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) {
  int32_t id = 0;
  std::vector<BatchEntry> entries{{tokens, n, &kv}};
  run(entries, [&](int r) {
    const int32_t rank_id = ranks_[static_cast<size_t>(r)]->forward_greedy(tokens, n, kv);
    if (r == 0) id = rank_id;  // every rank draws the same
  });
  return id;
}

void TensorParallelRunner::forward_batch(const std::vector<BatchEntry>& entries, float* logits) {
  const size_t count = static_cast<size_t>(logits_rows(entries) * model_.spec.vocab_size);
  run(entries, [&](int r) {
    ranks_[static_cast<size_t>(r)]->forward_batch(entries, r == 0 ? logits : scratch_floats(r, count));
  });
}

void TensorParallelRunner::forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params,
                                         int32_t* ids, const MaskSource& masks) {
  // Every rank draws from the same logits under the same masks: made once, before the ranks run.
  const uint32_t* made = masks ? masks() : nullptr;
  const MaskSource same = [made] { return made; };
  run(entries, [&](int r) {
    ranks_[static_cast<size_t>(r)]->forward_batch(
        entries, params, r == 0 ? ids : scratch_ids(r, static_cast<size_t>(logits_rows(entries))),
        made ? same : MaskSource{});
  });
}

}  // namespace kettle
