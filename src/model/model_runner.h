// ModelRunner: what the engine asks of a loaded model — prefill and decode of
// one or many sequences over their paged caches. DecoderRunner runs the whole
// model on one backend; TensorParallelRunner runs it split over several ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"
#include "kv/kv_quant.h"
#include "model/model.h"
#include "model/model_spec.h"

namespace kettle {

enum class LogitsFor { kLastToken, kAllTokens };

// One sequence's part of a batched step: its next tokens (host memory) and its cache,
// and whether they are prompt tokens or the one token it generated last (decode). A
// device runs each kind through its own kernels, whose sums do not depend on the batch,
// so a token gets the same logits alone or batched if its kind is the same; the decode
// entries of a step come first. A verify (speculation) is one decode entry per row, all
// over the same cache, row i `ahead` i positions past its length: each row attends to the
// rows before it, written in the same step, as a decode of that token alone would.
struct BatchEntry {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  KvCache* kv = nullptr;
  bool decode = false;
  int64_t logits = 1;  // rows of logits it gets back: its last `logits` tokens'
  int64_t ahead = 0;   // its first token's position past kv->length()
};

// The logits rows a batch's entries get back in all.
int64_t logits_rows(const std::vector<BatchEntry>& entries);
// Before a step: blocks for every entry's positions. After it: each cache holds the
// positions of its furthest entry.
void reserve_caches(const std::vector<BatchEntry>& entries);
void advance_caches(const std::vector<BatchEntry>& entries);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // The model as the engine sees it (the whole vocabulary, also when split).
  virtual const ModelSpec& spec() const = 0;
  virtual KvPool& kv_pool() = 0;  // the pool it was made over
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
  // logits of each entry's last `logits` tokens, entry after entry (host memory):
  // [logits_rows(entries), vocab].
  virtual void forward_batch(const std::vector<BatchEntry>& entries, float* logits) = 0;

  // Token masks for a step's draws (constrained decoding): called once the forward is under
  // way, so the host computes them while the device runs; returns [rows, ceil(vocab / 32)]
  // words (host memory, Backend::mask_logits' layout), or nullptr for no masks.
  using MaskSource = std::function<const uint32_t*()>;

  // As forward_batch, then a token drawn from each logits row where the logits live as
  // params[row] (host memory) says, after the masks when `masks` gives some: only the ids
  // cross to the host.
  virtual void forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids,
                             const MaskSource& masks = {}) = 0;
};

// The whole model on one backend (a DecoderRunner), or split over several (tensor
// parallelism, one rank per backend), over `pool` (made by make_kv_pool for the same
// model and backends). The backends and the pool must outlive the runner.
std::unique_ptr<ModelRunner> make_model_runner(const Model& model, const std::vector<Backend*>& backends, KvPool& pool);

// What the KV store of `spec` holds on each of `ranks` ranks: a layer with a sliding
// window keeps its window, any other all positions; each layer's rows stored as `quant`
// says (kv/kv_quant.h), `element` (the backend's Backend::kv_dtype) where it keeps them plain.
KvLayout kv_layout(const ModelSpec& spec, DType element, int ranks = 1, const KvQuant& quant = {});

// The KV pool a runner of `model` on `backends` reads (one set of buffers per rank).
std::unique_ptr<KvPool> make_kv_pool(const ModelSpec& spec, const std::vector<Backend*>& backends,
                                     KvPool::Options options = {}, const KvQuant& quant = {});

// A runner with a pool of its own, for a tool that runs one model by itself (tests, the
// single-sequence benchmarks); the engine makes the two itself.
struct StandaloneRunner {
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<ModelRunner> runner;
  ModelRunner* operator->() const { return runner.get(); }
  ModelRunner& operator*() const { return *runner; }
};
StandaloneRunner make_standalone_runner(const Model& model, const std::vector<Backend*>& backends,
                                        KvPool::Options options = {}, const KvQuant& quant = {});

}  // namespace kettle
