// ModelRunner: what the engine asks of a loaded model — prefill and decode of
// one or many sequences over their paged caches. Transformer runs the whole
// model on one backend; TensorParallelRunner runs it split over several ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/kv_cache.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "model/model_spec.h"

namespace kettle {

enum class LogitsFor { kLastToken, kAllTokens };

// One sequence's part of a batched step: its next tokens (host memory) and its cache,
// and whether they are prompt tokens or the one token it generated last (decode). A
// device runs each kind through its own kernels, whose sums do not depend on the batch,
// so a token gets the same logits alone or batched if its kind is the same; the decode
// entries of a step come first.
struct BatchEntry {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  KvCache* kv = nullptr;
  bool decode = false;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // The model as the engine sees it (the whole vocabulary, also when split).
  virtual const ModelSpec& spec() const = 0;
  virtual KvPool& kv_pool() = 0;
  KvCache new_cache() { return KvCache(kv_pool()); }

  // Runs tokens[0, n) (host memory) at positions [kv.length(), kv.length() + n), appends
  // their keys and values to kv, and writes logits (host memory): [1, vocab] for the last
  // token or [n, vocab] for all. One token after a non-empty cache runs as a decode
  // (BatchEntry::decode), anything else as prompt tokens.
  virtual void forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) = 0;

  // As forward, then the last token's greedy next id computed where the logits live:
  // on a GPU only the id crosses to the host.
  virtual int32_t forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) = 0;

  // Several sequences in one pass (continuous batching): the matmuls run over every
  // entry's tokens at once, attention per sequence over its own cache. Writes the
  // logits of each entry's last token (host memory): [entries.size(), vocab].
  virtual void forward_batch(const std::vector<BatchEntry>& entries, float* logits) = 0;

  // As forward_batch, then each entry's next token drawn where the logits live as
  // params[i] (host memory) says: only the ids cross to the host.
  virtual void forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids) = 0;
};

// The whole model on one backend (a Transformer), or split over several (tensor
// parallelism, one rank per backend). The backends must outlive the runner.
std::unique_ptr<ModelRunner> make_model_runner(const Model& model, const std::vector<Backend*>& backends,
                                               KvPool::Options kv = {});

}  // namespace kettle
