// DecoderRunner: the ModelRunner of one backend — the one generic decoder
// forward every family runs, reading its differences from ModelSpec and its
// tensors from ModelWeights, over a KV pool the engine made for it. Its scratch
// lives in the backend's memory. A step in which every sequence decodes one token is handed to
// Backend::run_step so a GPU backend records it once per batch-size bucket and
// replays it; on a device the batch is padded up to its bucket for that.
// Under tensor parallelism (model/tensor_parallel.h) one DecoderRunner runs each
// rank's shard, summing the row-parallel outputs and gathering the logits
// through the rank's Collective; the logits it returns cover the whole vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_array.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "model/rope_config.h"
#include "model/tensor_parallel.h"
#include "tensor/host_buffer.h"

namespace kettle {

class DecoderRunner final : public ModelRunner {
 public:
  // `pool` holds this model's KV (model_runner.h: make_kv_pool) and outlives the DecoderRunner.
  DecoderRunner(const Model& model, Backend& backend, KvPool& pool, TensorParallel tp = {});

  // This backend's model: a shard's spec under tensor parallelism (its heads, its
  // vocabulary slice); vocab() is the width of the logits it writes, always the whole.
  const ModelSpec& spec() const override { return model_.spec; }
  int64_t vocab() const { return vocab_; }
  Backend& backend() { return backend_; }
  KvPool& kv_pool() override { return *kv_pool_; }

  void forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) override;
  int32_t forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) override;
  void forward_batch(const std::vector<BatchEntry>& entries, float* logits) override;
  void forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids,
                     const MaskSource& masks = {}) override;

 private:
  // What one step reads; a member so the recorded lambda captures only `this`.
  // A sequence's rows [offset, offset + n) of the step; its block tables are row `index`
  // of the step's tables.
  struct Segment {
    int64_t offset = 0, n = 0, index = 0;
    bool decode = false;  // a generated token (BatchEntry::decode); padding rows too
    int64_t logits = 1;   // its last rows whose logits come back (last_per_segment)
  };
  struct Step {
    const int32_t* ids = nullptr;        // [n] backend memory
    const int32_t* positions = nullptr;  // [n] backend memory
    const int32_t* tables[KvPool::kKinds] = {};  // [segments, table_stride] backend memory
    int64_t table_stride = 0, max_kv = 0;
    int64_t n = 0, rows = 0;             // tokens, logits rows
    int64_t decode_rows = 0;             // the leading rows that are decodes (StepContext::decode_rows)
    std::vector<Segment> segments;       // one per sequence (padding rows included)
    bool last_per_segment = false;       // logits rows: each segment's last token (else the step's last rows)
    float* logits = nullptr;             // [rows, vocab] backend memory
    int32_t* next_id = nullptr;          // [1] backend memory, or nullptr: no argmax
  };
  enum class Rows { kLast, kAll, kLastPerEntry };
  // Builds the step for `entries` (reserving their blocks), uploads its inputs and runs
  // it — recorded when every entry decodes one token; their lengths advance.
  void execute(const std::vector<BatchEntry>& entries, Rows rows, float* host_logits, bool greedy);
  void fill_segments(const std::vector<BatchEntry>& entries, int64_t n_segments);
  void upload_step_inputs(int64_t n, int64_t n_segments);
  void run_step();
  void attention_block(int64_t layer);
  void mlp_block(int64_t layer);
  InputNorm norm_of(const Tensor& weight) const;
  const float* output_rows();
  void add_block_output(const float* x, int64_t ldx, const Linear& w, const Tensor& post_norm);
  void ensure_scratch(int64_t n, int64_t logits_rows);
  void ensure_tables(int64_t n_segments, int64_t stride);
  void update_ropes(int64_t seq_len);
  uint64_t step_key() const;
  KvPages pages(int64_t layer, int64_t segment, int64_t stride);

  const Model& model_;
  Backend& backend_;
  TensorParallel tp_;
  int64_t vocab_;  // logits width (the full vocabulary under tensor parallelism)
  // Dense copies of quantized weights the backend has no kernels for, when the backend
  // reads host memory in place (a device backend holds its own copy).
  std::vector<std::shared_ptr<void>> host_copies_;
  ModelWeights weights_;  // model_.weights as the backend reads them
  std::vector<RopeTable> ropes_;
  std::vector<int64_t> rope_len_;  // the seq_len each table was computed for (length-dependent types)
  std::vector<BackendArray<float>> rope_freqs_;  // [rotary_dim / 2] each, backend memory
  bool recordable_ = true;         // false when a RoPE table changes with the length
  Step step_;
  HostBuffer<int32_t> host_positions_;
  HostBuffer<int32_t> host_ids_;     // the entries' tokens, concatenated
  HostBuffer<int32_t> host_tables_[KvPool::kKinds];
  BackendArray<int32_t> tables_[KvPool::kKinds];  // device backends only
  int64_t table_capacity_ = 0;     // ints in each tables_ buffer
  BackendArray<SampleRow> sample_rows_;
  BackendArray<int32_t> sampled_;
  BackendArray<uint32_t> masks_;     // [rows, ceil(vocab / 32)] (device backends only)
  int64_t scratch_tokens_ = 0, logits_rows_ = 0;
  uint64_t scratch_epoch_ = 0;     // bumped whenever scratch moves (recorded steps go stale)
  BackendArray<int32_t> ids_;        // [n] (device backends only)
  BackendArray<int32_t> positions_;  // [n] (device backends only)
  BackendArray<float> hidden_;   // [n, hidden] the residual stream
  BackendArray<float> normed_;   // [n, hidden] (MoE input)
  BackendArray<float> qkv_;      // [n, q_size + 2 kv_size] packed projections
  BackendArray<float> q_;        // [n, q_size] roped queries
  BackendArray<float> attn_;     // [n, q_size]
  BackendArray<float> proj_;     // [n, hidden] block outputs under a sandwich norm, MoE
  BackendArray<float> mlp_;      // [n, 2 inter] [gate | up]
  BackendArray<float> logits_;   // [rows, vocab] (device backends, and greedy steps on the host)
  BackendArray<float> shard_logits_;  // [rows, this shard's vocabulary] (tensor parallelism)
  BackendArray<int32_t> next_id_;  // [1] the greedy step's result
  KvPool* kv_pool_;
  // This runner among every one the process makes: a backend keeps its recorded steps by key,
  // and runners on one backend (a destroyed one's successor too) must never replay each other's.
  const uint64_t instance_;
};

}  // namespace kettle
