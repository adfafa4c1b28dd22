// The generic decoder forward (pre-norm residual blocks):
//   h = embed(tokens) · embed_scale
//   per layer: h += [post_norm](attn(norm(h)));  h += [post_norm](mlp(norm(h)))
//   logits = [softcap](norm(h) · lm_headᵀ)   (an embedding model: norm(h) itself)
// Each norm is fused into the projection that reads it (Backend::project with an
// InputNorm), and each block's output projection adds straight into h (project
// accumulating) unless a sandwich norm sits between. Keys and values are written into the cache rows of their
// positions.
#include "model/decoder_runner.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "util/error.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kettle {
namespace {

Tensor resident(Backend& backend, const Tensor& t) { return t.empty() ? t : backend.resident(t); }

// A quantized (affine or FP8) weight as a dense bf16 one, for a backend without kernels for
// its scheme: the same values the CPU's kernels compute with (s · q + b, code · scale),
// rounded to bf16 (exact for affine bits ≤ 8 with bf16 scales and biases).
std::shared_ptr<std::vector<uint16_t>> dequantize_bf16(const Linear& l, ThreadPool& pool) {
  const int64_t rows = l.out_features(), cols = l.in_features();
  auto copy = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(rows * cols));
  std::vector<uint16_t>& dense = *copy;
  pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      dequantize_row(l, r, row.data());
      for (int64_t c = 0; c < cols; ++c)
        dense[static_cast<size_t>(r * cols + c)] = f32_to_bf16(row[static_cast<size_t>(c)]);
    }
  });
  return copy;
}

// The checkpoint's Linears as the backend reads them. A scheme the backend does not run is
// dequantized to bf16 first (host memory held only until a device backend has its copy,
// kept in host_copies for one that reads host memory in place; one copy per codes tensor,
// so a tied embedding and LM head stay one).
class ResidentLinears {
 public:
  ResidentLinears(Backend& backend, std::vector<std::shared_ptr<void>>& host_copies)
      : backend_(backend), host_copies_(host_copies) {}

  // split_rows: the Linear is later viewed as row blocks of this many rows (a fused
  // gate_up); a packed layout may keep rows in blocks of 16 (CUDA's tiles), so a split
  // inside a block takes the dense copy.
  Linear operator()(const Linear& l, int64_t split_rows = 0) {
    const bool splits_packed =
        l.scheme != WeightScheme::kDense && (split_rows % 16 != 0 || !l.views_rows_at(split_rows));
    return as_read(l, !l.empty() && backend_.can_run(l) && !splits_packed, "weights of this shape");
  }
  // A router or an expert (Backend::moe reads it).
  Linear expert(const Linear& l) { return as_read(l, backend_.can_run_expert(l), "experts and routers"); }

 private:
  Linear as_read(const Linear& l, bool runs_as_stored, const char* what) {
    if (l.empty() || runs_as_stored) return backend_.resident_linear(l);
    auto it = dequantized_.find(l.weight.data);
    if (it == dequantized_.end()) {
      if (warned_.insert(what).second)
        log::info("{} has no kernels for {} {}: dequantizing them to bf16 as they load", backend_.name(),
                  scheme_name(l), what);
      if (!pool_) pool_ = std::make_unique<ThreadPool>(ThreadPool::default_threads());
      const auto dense = dequantize_bf16(l, *pool_);
      Tensor weight = backend_.resident(Tensor{dense->data(), DType::kBF16, {l.out_features(), l.in_features()}});
      if (backend_.host_memory()) host_copies_.push_back(dense);
      it = dequantized_.emplace(l.weight.data, weight).first;
    }
    Linear r;
    r.weight = it->second;
    r.bias = resident(backend_, l.bias);
    r.adapter = l.adapter;
    return r;
  }

  Backend& backend_;
  std::vector<std::shared_ptr<void>>& host_copies_;
  std::map<const void*, Tensor> dequantized_;  // codes → the resident dense copy
  std::set<std::string> warned_;
  std::unique_ptr<ThreadPool> pool_;  // made for the first weight dequantized
};

// A fused [gate | up] projection as the two halves the gated op takes.
std::pair<Linear, Linear> split_gate_up(const Linear& both, int64_t inter) {
  return {both.rows(0, inter), both.rows(inter, inter)};
}

// The checkpoint's tensors as the backend reads them; fused gate_up becomes gate and up views.
ModelWeights resident_weights(Backend& backend, const ModelSpec& spec, const ModelWeights& w,
                              std::vector<std::shared_ptr<void>>& host_copies) {
  ModelWeights out;
  ResidentLinears linear(backend, host_copies);
  out.embed = linear(w.embed);
  out.final_norm = resident(backend, w.final_norm);
  out.lm_head = linear(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    LayerWeights r;
    for (auto [dst, src] : {std::pair{&r.attn_norm, &l.attn_norm}, {&r.q_norm, &l.q_norm}, {&r.k_norm, &l.k_norm},
                            {&r.attn_post_norm, &l.attn_post_norm}, {&r.ffn_norm, &l.ffn_norm},
                            {&r.ffn_post_norm, &l.ffn_post_norm}})
      *dst = resident(backend, *src);
    r.router = linear.expert(l.router);
    for (auto [dst, src] : {std::pair{&r.q, &l.q}, {&r.k, &l.k}, {&r.v, &l.v}, {&r.qkv, &l.qkv}, {&r.o, &l.o},
                            {&r.gate, &l.gate}, {&r.up, &l.up}, {&r.down, &l.down}})
      *dst = linear(*src);
    if (!l.gate_up.empty()) std::tie(r.gate, r.up) = split_gate_up(linear(l.gate_up, spec.intermediate_size), spec.intermediate_size);
    for (const ExpertWeights& e : l.experts)
      r.experts.push_back({linear.expert(e.gate), linear.expert(e.up), linear.expert(e.down)});
    out.layers.push_back(std::move(r));
  }
  return out;
}

}  // namespace

namespace {
std::atomic<uint64_t> runners_made{0};
}  // namespace

DecoderRunner::DecoderRunner(const Model& model, Backend& backend, KvPool& pool, TensorParallel tp)
    : model_(model),
      backend_(backend),
      tp_(tp),
      vocab_(tp.collective != nullptr ? tp.full_vocab : model.spec.output_width()),
      weights_(resident_weights(backend, model.spec, model.weights, host_copies_)),
      kv_pool_(&pool),
      instance_(++runners_made) {
  for (size_t i = 0; i < model.spec.ropes.size(); ++i) {
    ropes_.push_back(compute_rope_table(model.spec.ropes[i], model.spec.head_dim, model.spec.max_position_embeddings, 0,
                                        model.spec.rope_freq_dtype));
    rope_len_.push_back(0);
    BackendArray<float> freqs(backend, ropes_.back().inv_freq.size());
    backend.to_device(freqs.data(), ropes_.back().inv_freq.data(), freqs.bytes());
    rope_freqs_.push_back(std::move(freqs));
    if (rope_depends_on_length(model.spec.ropes[i])) recordable_ = false;
  }
}

void DecoderRunner::update_ropes(int64_t seq_len) {
  for (size_t i = 0; i < ropes_.size(); ++i) {
    const RopeSpec& spec = model_.spec.ropes[i];
    if (!rope_depends_on_length(spec) || rope_len_[i] == seq_len) continue;
    ropes_[i] = compute_rope_table(spec, model_.spec.head_dim, model_.spec.max_position_embeddings, seq_len,
                                   model_.spec.rope_freq_dtype);
    rope_len_[i] = seq_len;
    backend_.to_device(rope_freqs_[i].data(), ropes_[i].inv_freq.data(), rope_freqs_[i].bytes());
  }
}

void DecoderRunner::ensure_scratch(int64_t n, int64_t logits_rows) {
  const ModelSpec& s = model_.spec;
  const bool device = !backend_.host_memory();
  if (n > scratch_tokens_) {
    const auto array = [&](int64_t width) { return BackendArray<float>(backend_, static_cast<size_t>(n * width)); };
    int64_t inter = std::max(s.intermediate_size, s.expert_intermediate_size);
    hidden_ = array(s.hidden_size);
    normed_ = array(s.hidden_size);
    qkv_ = array(s.q_size() + 2 * s.kv_size());
    q_ = array(s.q_size());
    attn_ = array(s.q_size());
    proj_ = array(s.hidden_size);
    mlp_ = array(2 * inter);
    host_positions_.resize(static_cast<size_t>(n));
    if (device) {
      ids_ = BackendArray<int32_t>(backend_, static_cast<size_t>(n));
      positions_ = BackendArray<int32_t>(backend_, static_cast<size_t>(n));
    }
    scratch_tokens_ = n;
    ++scratch_epoch_;
  }
  if (logits_rows > logits_rows_) {
    logits_ = BackendArray<float>(backend_, static_cast<size_t>(logits_rows * vocab_));
    if (next_id_.size() == 0) next_id_ = BackendArray<int32_t>(backend_, 1);
    logits_rows_ = logits_rows;
    ++scratch_epoch_;
  }
}

void DecoderRunner::ensure_tables(int64_t n_segments, int64_t stride) {
  const int64_t count = n_segments * stride;
  for (auto& host : host_tables_)
    if (static_cast<int64_t>(host.size()) < count) host.resize(static_cast<size_t>(count));
  if (backend_.host_memory() || count <= table_capacity_) return;
  for (auto& device : tables_) device = BackendArray<int32_t>(backend_, static_cast<size_t>(count));
  table_capacity_ = count;
  ++scratch_epoch_;
}

// Same key ⇒ same op sequence on the same buffers: this runner, the step's shape, the
// pool's buffers and the scratch generation (block tables and positions are read from memory).
uint64_t DecoderRunner::step_key() const {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(instance_);
  for (int64_t v : {step_.n, step_.rows, step_.table_stride, step_.max_kv}) mix(static_cast<uint64_t>(v));
  mix(step_.next_id != nullptr ? 1 : 0);
  mix(kv_pool_->epoch());
  mix(scratch_epoch_);
  return h;
}

// Decode steps are recorded per bucket of batch size and of table width, so a handful
// of recordings serve every batch; the padding rows decode token 0 at position 0 into
// block 0, which no sequence reads.
namespace {
int64_t bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}
// The single-sequence calls' kind of step: one token after a non-empty cache is a decode.
bool is_decode(int64_t n, const KvCache& kv) { return n == 1 && kv.length() > 0; }

}  // namespace

void DecoderRunner::forward(const int32_t* tokens, int64_t n, KvCache& kv, LogitsFor which, float* logits) {
  const int64_t rows = which == LogitsFor::kAllTokens ? n : 1;
  execute({{tokens, n, &kv, is_decode(n, kv)}}, which == LogitsFor::kAllTokens ? Rows::kAll : Rows::kLast, logits, false);
  if (!backend_.host_memory())
    backend_.to_host(logits, logits_.data(), static_cast<size_t>(rows * vocab_) * sizeof(float));
}

int32_t DecoderRunner::forward_greedy(const int32_t* tokens, int64_t n, KvCache& kv) {
  execute({{tokens, n, &kv, is_decode(n, kv)}}, Rows::kLast, nullptr, true);
  int32_t id = 0;
  backend_.to_host(&id, next_id_.data(), sizeof id);
  return id;
}

void DecoderRunner::forward_batch(const std::vector<BatchEntry>& entries, float* logits) {
  execute(entries, Rows::kLastPerEntry, logits, false);
  if (!backend_.host_memory())
    backend_.to_host(logits, logits_.data(), static_cast<size_t>(logits_rows(entries) * vocab_) * sizeof(float));
}

void DecoderRunner::forward_batch(const std::vector<BatchEntry>& entries, const SampleRow* params, int32_t* ids,
                                  const MaskSource& masks) {
  execute(entries, Rows::kLastPerEntry, nullptr, false);
  const int64_t rows = logits_rows(entries);
  // The device runs the step while the host makes the masks.
  const uint32_t* host_masks = masks ? masks() : nullptr;
  const int64_t words = (vocab_ + 31) / 32;
  if (backend_.host_memory()) {
    if (host_masks != nullptr) backend_.mask_logits(logits_.data(), rows, vocab_, host_masks);
    backend_.sample(logits_.data(), rows, vocab_, params, ids);
    return;
  }
  if (host_masks != nullptr) {
    if (static_cast<int64_t>(masks_.size()) < rows * words)
      masks_ = BackendArray<uint32_t>(backend_, static_cast<size_t>(bucket(rows) * words));
    backend_.to_device(masks_.data(), host_masks, static_cast<size_t>(rows * words) * sizeof(uint32_t));
    backend_.mask_logits(logits_.data(), rows, vocab_, masks_.data());
  }
  if (static_cast<int64_t>(sampled_.size()) < rows) {
    sample_rows_ = BackendArray<SampleRow>(backend_, static_cast<size_t>(bucket(rows)));
    sampled_ = BackendArray<int32_t>(backend_, static_cast<size_t>(bucket(rows)));
  }
  backend_.to_device(sample_rows_.data(), params, static_cast<size_t>(rows) * sizeof(SampleRow));
  backend_.sample(logits_.data(), rows, vocab_, sample_rows_.data(), sampled_.data());
  backend_.to_host(ids, sampled_.data(), static_cast<size_t>(rows) * sizeof(int32_t));
}

void DecoderRunner::execute(const std::vector<BatchEntry>& entries, Rows rows_for, float* host_logits, bool greedy) {
  const bool host = backend_.host_memory();
  int64_t n = 0, longest = 0, decode_rows = 0;
  bool decode_only = recordable_;
  const bool owns_caches = !tp_.shared_pool;  // else the runner reserves and advances them
  for (const BatchEntry& e : entries) {
    if (e.decode && (e.n != 1 || n != decode_rows))
      fail(ErrorCategory::kInternal, "forward_batch: a decode entry has one token and comes before every prompt entry");
    if (e.logits < 1 || e.logits > e.n)
      fail(ErrorCategory::kInternal, "forward_batch: an entry of {} tokens asks for {} logits rows", e.n, e.logits);
    n += e.n;
    if (e.decode) ++decode_rows;
    longest = std::max(longest, e.kv->length() + e.ahead + e.n);
    decode_only = decode_only && e.decode;
  }
  if (owns_caches) reserve_caches(entries);
  const auto n_entries = static_cast<int64_t>(entries.size());
  const bool record = decode_only && !host;
  const int64_t n_segments = record ? bucket(n_entries) : n_entries;
  if (record) n = decode_rows = n_segments;
  // Per entry its last `logits` rows; a padding segment (a recorded step's bucket) one.
  const int64_t rows = rows_for == Rows::kAll    ? n
                       : rows_for == Rows::kLast ? 1
                                                 : logits_rows(entries) + (n_segments - n_entries);
  // The host backend writes logits straight into the caller's buffer unless it needs them itself.
  const bool own_logits = !host || greedy || host_logits == nullptr;
  ensure_scratch(n, own_logits ? rows : 0);
  if (tp_.collective != nullptr && shard_logits_.size() < static_cast<size_t>(rows * model_.spec.vocab_size)) {
    shard_logits_ = BackendArray<float>(backend_, static_cast<size_t>(rows * model_.spec.vocab_size));
    ++scratch_epoch_;
  }
  update_ropes(longest);

  const int64_t bs = kv_pool_->block_size();
  const int64_t blocks = std::max<int64_t>(1, (longest + bs - 1) / bs);  // the longest table of the step
  const int64_t stride = record ? bucket(blocks) : blocks;
  ensure_tables(n_segments, stride);
  if (static_cast<int64_t>(host_ids_.size()) < n) host_ids_.resize(static_cast<size_t>(n));
  step_.table_stride = stride;
  step_.max_kv = stride * bs;
  fill_segments(entries, n_segments);
  step_.n = n;
  step_.decode_rows = decode_rows;
  step_.rows = rows;
  step_.last_per_segment = rows_for == Rows::kLastPerEntry;
  step_.logits = own_logits ? logits_.data() : host_logits;
  step_.next_id = greedy ? next_id_.data() : nullptr;
  upload_step_inputs(n, n_segments);
  // The whole step under its context: the decodes' rows first (the logits rows' too), and
  // exact activations for MoE models: routing picks experts by comparing logits, and
  // bf16-rounded activations would flip near ties the reference (f32) does not.
  const StepContext context{decode_rows, model_.spec.n_experts > 0};
  backend_.run_step(context, record ? step_key() : 0, [this] { run_step(); });
  if (owns_caches) advance_caches(entries);
}

// The step's host inputs: each segment's token ids and positions, and its block tables
// (one row of table_stride ids per kind); padding segments decode token 0 at position 0
// through an all-zero table (block 0).
void DecoderRunner::fill_segments(const std::vector<BatchEntry>& entries, int64_t n_segments) {
  const auto n_entries = static_cast<int64_t>(entries.size());
  const int64_t stride = step_.table_stride;
  step_.segments.clear();
  int64_t offset = 0;
  for (int64_t i = 0; i < n_segments; ++i) {
    const BatchEntry* e = i < n_entries ? &entries[static_cast<size_t>(i)] : nullptr;
    const int64_t len = e ? e->kv->length() + e->ahead : 0, count = e ? e->n : 1, logits = e ? e->logits : 1;
    const bool decode = e ? e->decode : true;
    for (int64_t t = 0; t < count; ++t) {
      host_positions_[static_cast<size_t>(offset + t)] = static_cast<int32_t>(len + t);
      host_ids_[static_cast<size_t>(offset + t)] = e ? e->tokens[t] : 0;
    }
    for (int kind = 0; kind < KvPool::kKinds; ++kind) {
      int32_t* row = host_tables_[kind].data() + i * stride;
      std::fill(row, row + stride, 0);
      if (e) std::copy(e->kv->table(kind).begin(), e->kv->table(kind).end(), row);
    }
    step_.segments.push_back({offset, count, i, decode, logits});
    offset += count;
  }
}

void DecoderRunner::upload_step_inputs(int64_t n, int64_t n_segments) {
  const size_t table_bytes = static_cast<size_t>(n_segments * step_.table_stride) * sizeof(int32_t);
  if (backend_.host_memory()) {
    step_.ids = host_ids_.data();
    step_.positions = host_positions_.data();
    for (int kind = 0; kind < KvPool::kKinds; ++kind) step_.tables[kind] = host_tables_[kind].data();
    return;
  }
  backend_.to_device(ids_.data(), host_ids_.data(), static_cast<size_t>(n) * sizeof(int32_t));
  backend_.to_device(positions_.data(), host_positions_.data(), static_cast<size_t>(n) * sizeof(int32_t));
  step_.ids = ids_.data();
  step_.positions = positions_.data();
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    if (kv_pool_->has_kind(kind)) backend_.to_device(tables_[kind].data(), host_tables_[kind].data(), table_bytes);
    step_.tables[kind] = tables_[kind].data();
  }
}

KvPages DecoderRunner::pages(int64_t layer, int64_t segment, int64_t stride) {
  KvPool& pool = *kv_pool_;
  const int kind = pool.kind_of(layer);
  return KvPages{pool.keys(layer, tp_.pool_rank), pool.values(layer, tp_.pool_rank), pool.kv_size(), pool.block_size(),
                 step_.tables[kind] + segment * step_.table_stride, stride, pool.codec(layer)};
}

void DecoderRunner::run_step() {
  const ModelSpec& s = model_.spec;
  const ModelWeights& w = weights_;
  const int64_t n = step_.n, h = s.hidden_size;
  backend_.embed(step_.ids, n, w.embed, s.embed_scale, hidden_.data());
  for (int64_t layer = 0; layer < s.n_layers; ++layer) {
    attention_block(layer);
    mlp_block(layer);
  }
  const float* last_rows = output_rows();
  if (s.hidden_output) {  // an embedding model: its output is the final norm's hidden states
    backend_.rms_norm(last_rows, step_.rows, h, h, w.final_norm, s.rms_norm_eps, s.norm_add_one, step_.logits, h);
    return;
  }
  // Under tensor parallelism the head writes this rank's vocabulary slice, then the ranks gather.
  float* head_out = tp_.collective != nullptr ? shard_logits_.data() : step_.logits;
  const Projection head{&w.lm_head, head_out, s.vocab_size};
  const InputNorm final_norm = norm_of(w.final_norm);
  backend_.project(last_rows, step_.rows, h, &final_norm, &head, 1);
  if (tp_.collective != nullptr)
    tp_.collective->all_gather_columns(head_out, step_.rows, s.vocab_size, tp_.vocab_begin, step_.logits, vocab_);
  if (s.final_softcap > 0.0f) backend_.softcap(step_.logits, step_.rows * vocab_, s.final_softcap);
  if (step_.next_id != nullptr) backend_.argmax(step_.logits, 1, vocab_, step_.next_id);
}

// The hidden rows the head reads: each segment's last `logits` rows, gathered when a batch
// holds prompt chunks.
const float* DecoderRunner::output_rows() {
  const int64_t n = step_.n, h = model_.spec.hidden_size;
  if (!step_.last_per_segment || step_.rows == n) return hidden_.data() + (n - step_.rows) * h;
  int64_t row = 0;
  for (const Segment& seg : step_.segments) {
    backend_.copy(normed_.data() + row * h, hidden_.data() + (seg.offset + seg.n - seg.logits) * h,
                  static_cast<size_t>(seg.logits * h) * sizeof(float));
    row += seg.logits;
  }
  return normed_.data();
}

InputNorm DecoderRunner::norm_of(const Tensor& weight) const {
  return InputNorm{&weight, model_.spec.rms_norm_eps, model_.spec.norm_add_one};
}

// A block's output: added straight into the residual stream, or through its sandwich
// norm (Gemma 2/3) first.
void DecoderRunner::add_block_output(const float* x, int64_t ldx, const Linear& w, const Tensor& post_norm) {
  const ModelSpec& s = model_.spec;
  const int64_t n = step_.n, h = s.hidden_size;
  if (post_norm.empty() && tp_.collective == nullptr) {
    const Projection into_residual{&w, hidden_.data(), h};
    backend_.project(x, n, ldx, nullptr, &into_residual, 1, true);
    return;
  }
  const Projection out{&w, proj_.data(), h};
  backend_.project(x, n, ldx, nullptr, &out, 1);
  // A row-parallel projection: each rank holds a part of the sum (rank 0 the bias).
  if (tp_.collective != nullptr) tp_.collective->all_reduce_sum(proj_.data(), n * h);
  if (post_norm.empty()) {
    backend_.add(hidden_.data(), proj_.data(), n * h);
    return;
  }
  backend_.rms_norm(proj_.data(), n, h, h, post_norm, s.rms_norm_eps, s.norm_add_one, proj_.data(), h);
  backend_.add(hidden_.data(), proj_.data(), n * h);
}

void DecoderRunner::attention_block(int64_t layer) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const LayerSpec& ls = s.layers[static_cast<size_t>(layer)];
  const int64_t n = step_.n, qs = s.q_size(), kvs = s.kv_size();
  const int64_t width = qs + 2 * kvs;  // qkv_ rows: [q | k | v]

  const InputNorm attn_norm = norm_of(w.attn_norm);
  if (!w.qkv.empty()) {
    const Projection qkv{&w.qkv, qkv_.data(), width};
    backend_.project(hidden_.data(), n, s.hidden_size, &attn_norm, &qkv, 1);
  } else {
    const Projection qkv[] = {
        {&w.q, qkv_.data(), width}, {&w.k, qkv_.data() + qs, width}, {&w.v, qkv_.data() + qs + kvs, width}};
    backend_.project(hidden_.data(), n, s.hidden_size, &attn_norm, qkv, 3);
  }
  const RopeTable& table = ropes_[static_cast<size_t>(ls.rope)];
  RopeParams rope{rope_freqs_[static_cast<size_t>(ls.rope)].data(), table.rotary_dim, table.attention_factor};
  const auto optional = [](const Tensor& t) { return t.empty() ? nullptr : &t; };
  QkvLayout layout{s.n_heads,       s.n_kv_heads,    s.head_dim, optional(w.q_norm), optional(w.k_norm),
                   s.rms_norm_eps, s.norm_add_one};
  AttentionParams params{s.n_heads, s.n_kv_heads, s.head_dim, s.attn_scale, s.attn_softcap, ls.sliding_window};
  // The decodes share one call, each token through its own table; a prompt chunk gets a
  // call of its own over its one table (table_stride 0), whatever its length.
  const auto& segs = step_.segments;
  for (size_t i = 0; i < segs.size();) {
    size_t j = i + 1;
    if (segs[i].decode)
      while (j < segs.size() && segs[j].decode) ++j;
    const int64_t offset = segs[i].offset, count = segs[j - 1].offset + segs[j - 1].n - offset;
    const KvPages kv = pages(layer, segs[i].index, segs[i].decode ? step_.table_stride : 0);
    const int32_t* positions = step_.positions + offset;
    backend_.qkv_rope_store(qkv_.data() + offset * width, count, width, layout, positions, rope, q_.data() + offset * qs, kv);
    backend_.attention(q_.data() + offset * qs, count, qs, kv, positions, step_.max_kv, params, attn_.data() + offset * qs, qs);
    i = j;
  }
  add_block_output(attn_.data(), qs, w.o, w.attn_post_norm);
}

void DecoderRunner::mlp_block(int64_t layer) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int64_t n = step_.n, h = s.hidden_size;

  if (s.layers[static_cast<size_t>(layer)].moe) {
    MoeParams params{s.experts_per_token, s.norm_topk_prob, s.act};
    backend_.rms_norm(hidden_.data(), n, h, h, w.ffn_norm, s.rms_norm_eps, s.norm_add_one, normed_.data(), h);
    backend_.moe(normed_.data(), n, h, w.router, w.experts, params, proj_.data());
    if (!w.ffn_post_norm.empty())
      backend_.rms_norm(proj_.data(), n, h, h, w.ffn_post_norm, s.rms_norm_eps, s.norm_add_one, proj_.data(), h);
    backend_.add(hidden_.data(), proj_.data(), n * h);
    return;
  }
  const int64_t inter = s.intermediate_size, width = 2 * inter;  // mlp_ rows: [gate | up]
  const InputNorm ffn_norm = norm_of(w.ffn_norm);
  backend_.project_gated(hidden_.data(), n, h, &ffn_norm, {&w.gate, mlp_.data(), width},
                         {&w.up, mlp_.data() + inter, width}, s.act, mlp_.data(), width);
  add_block_output(mlp_.data(), width, w.down, w.ffn_post_norm);
}

}  // namespace kettle
