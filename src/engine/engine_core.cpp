// The step loop's body. A step's forward runs every planned entry at once;
// tokens are drawn where the logits live when every drawing entry allows it
// (no penalties, bias, logprobs or verification: only ids cross), else on the
// host by each sequence's sampler. A verify entry's rows are drawn in order
// until one disagrees with its draft, so the tokens are those decoding one at a
// time would draw from the same logits; the rejected drafts' KV is rolled back.
#include "engine/engine_core.h"

#include "engine/draft_model.h"

#include <algorithm>
#include <cmath>

#include "model/model_fingerprint.h"
#include "model/rope_config.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle {
namespace {

static_assert(EngineOptions::kDefaultKvBlockSize == KvPool::kDefaultBlockSize);

// A RoPE that changes with the sequence length (dynamic NTK) rotates cached keys for
// another length than a fresh run would: no prefix reuse for those models.
bool any_rope_depends_on_length(const ModelSpec& spec) {
  return std::any_of(spec.ropes.begin(), spec.ropes.end(), [](const RopeSpec& r) { return rope_depends_on_length(r); });
}

std::unique_ptr<KvPool> pool_for(const Model& model, const std::vector<Backend*>& backends, const EngineOptions& o) {
  auto pool = make_kv_pool(model.spec, backends,
                           KvPool::Options{o.kv_block_size, o.kv_budget_bytes, std::max(1, o.batch), o.prefill_chunk},
                           o.kv_quant);
  if (o.reserve_kv) pool->preallocate();
  return pool;
}

// Everything the bytes of a KV block depend on besides the tokens: the policy's name first
// (the entry directory is named by it), each layer's kind, window and codecs, the block
// size, the ranks and their share of the heads.
std::string kv_layout_identity(const KvPool& pool, const std::string& policy, size_t ranks) {
  const KvLayout& layout = pool.layout();
  std::string text = fmt::format("{} block={} ranks={} heads={}x{}", policy, pool.block_size(), ranks, layout.kv_heads,
                                 layout.head_dim);
  for (const KvLayer& layer : layout.layers)
    text += fmt::format(" {}{}:{}/{}", layer.kind == KvLayer::Kind::kFull ? "full" : layer.kind == KvLayer::Kind::kWindow ? "window" : "none",
                        layer.kind == KvLayer::Kind::kWindow ? std::to_string(layer.window) : "",
                        kv_codec_name(layer.codec.key), kv_codec_name(layer.codec.value));
  return text;
}

std::unique_ptr<SsdTier> tier_for(const Model& model, const KvPool& pool, const EngineOptions& o, bool cache_on) {
  if (o.ssd.dir.empty()) return nullptr;
  if (o.prompt_cache_bytes == 0)
    fail(ErrorCategory::kInvalidArgument, "--ssd-cache needs the prompt cache (--prompt-cache above 0): it holds what "
         "the disk tier keeps");
  if (!cache_on)
    fail(ErrorCategory::kUnsupported, "--ssd-cache: {} uses a RoPE that changes with the sequence length, so its "
         "prefixes are never reused", model.source);
  const ModelFingerprint fp = model_fingerprint(model.source);
  return std::make_unique<SsdTier>(
      o.ssd, SsdIdentity{model_folder_name(model.source), fp.weights, fp.tokenizer,
                         kv_layout_identity(pool, o.kv_quant.name(), pool.ranks())});
}

// Collects one generation's ids and end for generate().
class CollectingSink final : public GenerationSink {
 public:
  explicit CollectingSink(const std::function<void(const GenerationOutput&)>& forward) : forward_(forward) {}
  void on_output(GenerationOutput output) override {
    result.tokens.insert(result.tokens.end(), output.ids.begin(), output.ids.end());
    if (forward_) forward_(output);
  }
  void on_end(const GenerationEnd& end) override { result.end = end; }
  GenerationResult result;

 private:
  const std::function<void(const GenerationOutput&)>& forward_;
};

// A request that never reached the queue ends at once, its error's kind kept.
void refuse(GenerationSink& sink, const std::exception& e) {
  GenerationEnd end;
  end.finish_reason = "error";
  end.error = e.what();
  if (const auto* error = dynamic_cast<const Error*>(&e)) end.error_category = error->category();
  sink.on_end(end);
}

}  // namespace

EngineCore::EngineCore(const Model& model, const Tokenizer* tokenizer, const std::vector<Backend*>& backends,
                       EngineOptions options)
    : model_(model),
      tokenizer_(tokenizer),
      backends_(backends),
      pool_(pool_for(model, backends, options)),
      runner_(make_model_runner(model, backends, *pool_)),
      tier_(tier_for(model, *pool_, options, !any_rope_depends_on_length(model.spec))),
      prefix_cache_(options.prompt_cache_bytes > 0 && !any_rope_depends_on_length(model.spec)
                        ? std::make_unique<PrefixCache>(*pool_, options.prompt_cache_bytes)
                        : nullptr),
      scheduler_(Scheduler::Options{options.batch, options.prefill_chunk}, *pool_, prefix_cache_.get()),
      vocab_(model.spec.vocab_size),
      kv_quant_name_(options.kv_quant.name()),
      width_(model.spec.output_width()) {
  // Out of free blocks, the pool takes back cached ones nobody holds (least recently used
  // first). The engine's one thread makes every pool and cache call, this one included.
  if (prefix_cache_) pool_->set_reclaimer([this] { return prefix_cache_->evict_one(); });
  if (prefix_cache_ && tier_) prefix_cache_->set_disk_tier(tier_.get());
  demote_idle_seconds_ = options.ssd.demote_idle_seconds;
  if (options.checkpoint_every > 0 && !tier_)
    fail(ErrorCategory::kInvalidArgument, "--generation-checkpoint needs --ssd-cache: checkpoints are written there");
  checkpoint_every_ = options.checkpoint_every;
  const SpeculationOptions& spec = options.speculation;
  check_speculation(spec);
  if (spec.on() && model_.spec.hidden_output)
    fail(ErrorCategory::kInvalidArgument, "--draft-kind {}: {} is an embedding model (nothing is decoded)",
         draft_kind_name(spec.kind), model_.source);
  if (spec.kind == DraftKind::kNgram) drafter_ = std::make_unique<NgramDrafter>(spec.ngram_max, spec.ngram_min);
  if (spec.kind == DraftKind::kModel)
    drafter_ = std::make_unique<ModelDrafter>(spec.draft_model, model_, tokenizer_, *backends_[0], spec.max_drafts(),
                                              spec.draft_kv_bytes);
  speculating_ = drafter_ != nullptr;
  speculation_.kind = draft_kind_name(spec.kind);
  speculation_.max_drafts = spec.on() ? spec.max_drafts() : 0;
}

EngineCore::~EngineCore() = default;

void EngineCore::submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink) {
  try {
    const int64_t worst = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
    if (model_.spec.hidden_output && request.pooling == Pooling::kNone)
      fail(ErrorCategory::kInvalidArgument, "{} is an embedding model: it computes embeddings, not text", model_.source);
    if (!model_.spec.hidden_output && request.pooling != Pooling::kNone)
      fail(ErrorCategory::kInvalidArgument, "{} is not an embedding model (its folder has no sentence-transformers "
           "Pooling module in modules.json)", model_.source);
    auto seq = std::make_unique<Sequence>(std::move(request), sink, tokenizer_, vocab_);
    if (!scheduler_.can_ever_fit(worst))
      fail(ErrorCategory::kResourceExhausted, "a prompt and max_tokens of {} positions need {} MiB of KV cache; the "
           "budget holds {} MiB", worst, kv_bytes(worst) >> 20, kv_admission_capacity() >> 20);
    find_checkpoint(*seq);
    if (seq->restore_ticket == 0) restore_prefix(*seq);
    scheduler_.enqueue(std::move(seq));
  } catch (const std::exception& e) {
    refuse(*sink, e);
  }
}

void EngineCore::restore_prefix(Sequence& seq) {
  if (!tier_ || !prefix_cache_ || seq.reads_every_prompt_row()) return;
  const uint64_t scope = seq.request().cache_scope;
  const std::vector<Sha256Digest> digests = prefix_cache_->digests(seq.tokens(), scope);
  const size_t first = prefix_cache_->blocks_in_memory(seq.tokens(), scope);
  if (first >= digests.size()) return;
  const std::span<const Sha256Digest> rest = std::span(digests).subspan(first);
  const size_t n = tier_->on_disk(rest);
  if (n == 0) return;
  seq.restore_ticket = tier_->restore({rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n)});
  const auto bs = static_cast<size_t>(pool_->block_size());
  restores_[seq.restore_ticket] = {std::vector<int32_t>(seq.tokens().begin(), seq.tokens().begin() +
                                                                                  static_cast<std::ptrdiff_t>((first + n) * bs + 1)),
                                   scope, first,
                                   (seq.prompt_size() + seq.request().max_tokens) / static_cast<int64_t>(bs) + 1};
}

// Only a generation that a retry reproduces is checkpointed: greedy, or sampled from the
// client's seed; and one whose whole state save() holds (no grammar, logprobs or pooling).
void EngineCore::find_checkpoint(Sequence& seq) {
  const GenerationRequest& r = seq.request();
  if (checkpoint_every_ <= 0 || !tier_ || !prefix_cache_ || r.max_tokens == 0 || r.pooling != Pooling::kNone ||
      r.constraint || r.prompt_logprobs || r.sampling.logprobs || (r.sampling.temperature > 0 && !r.sampling.seeded))
    return;
  const std::string identity = seq.request_identity().dump();
  seq.checkpoint_key = sha256(identity.data(), identity.size());
  if (!tier_->has_checkpoint(*seq.checkpoint_key)) return;
  seq.restore_ticket = tier_->load_checkpoint(*seq.checkpoint_key);
  checkpoint_loads_.insert(seq.restore_ticket);
}

void EngineCore::checkpoint_running() {
  if (checkpoint_every_ <= 0) return;
  for (const auto& seq : scheduler_.running_sequences()) {
    if (!seq->checkpoint_key || seq->finished() || !seq->decoding() || seq->produced() - seq->checkpointed < checkpoint_every_)
      continue;
    const auto n = static_cast<size_t>(seq->kv->length());
    prefix_cache_->insert(std::span<const int32_t>(seq->tokens().data(), n), *seq->kv, seq->request().cache_scope,
                          seq->prefix_hold);
    prefix_cache_->write_path(seq->prefix_hold);  // the blocks first: the state needs them
    SsdBlock state;
    state.op = SsdBlock::Op::kCheckpoint;
    state.digest = *seq->checkpoint_key;
    state.checkpoint = seq->save().dump();
    if (tier_->save(std::move(state))) seq->checkpointed = seq->produced();
  }
}

void EngineCore::take_restored() {
  if (!tier_ || (restores_.empty() && checkpoint_loads_.empty())) return;
  for (SsdTier::Restored& done : tier_->take_restored()) {
    if (checkpoint_loads_.erase(done.ticket) > 0) {
      Sequence* seq = scheduler_.waiting_on(done.ticket);
      if (seq == nullptr) continue;  // cancelled while it was read
      seq->restore_ticket = 0;
      if (!done.checkpoint.empty()) {
        try {
          seq->replay(nlohmann::json::parse(done.checkpoint), model_.generation.eos_token_ids, vocab_);
          seq->checkpointed = seq->produced();
          log::info("resuming a generation from its checkpoint after {} tokens", seq->produced());
        } catch (const std::exception& e) {  // a sequence half replayed cannot start over: it ends
          log::warn("ssd cache: a checkpoint did not replay: {}", e.what());
          seq->finish("error", fmt::format("its checkpoint did not replay: {}", e.what()));
        }
      }
      restore_prefix(*seq);
      continue;
    }
    auto it = restores_.find(done.ticket);
    if (it == restores_.end()) continue;
    try {
      // The pool grows once for the restored blocks and what the generation adds to them
      // (growing a block at a time, doubling, copies and touches the pool over and over).
      if (pool_->has_kind(KvPool::kFull)) pool_->reserve(KvPool::kFull, it->second.worst_blocks);
      prefix_cache_->restore(it->second.prompt, it->second.scope, it->second.first, done.entries);
    } catch (const std::exception& e) {  // a block that does not fit this pool: prefilled instead
      log::warn("ssd cache: restoring a prefix failed: {}", e.what());
    }
    scheduler_.restored(done.ticket);
    restores_.erase(it);
  }
}

void EngineCore::housekeeping() {
  if (!tier_ || !prefix_cache_) return;
  take_restored();
  if (demote_idle_seconds_ > 0) prefix_cache_->demote_idle(demote_idle_seconds_);
  prefix_cache_->write_behind();
}

int64_t EngineCore::hand_cache_to_disk() {
  if (!prefix_cache_) return 0;
  if (!tier_) return prefix_cache_->stats().entries;
  prefix_cache_->write_behind(/*again=*/true);
  return prefix_cache_->not_on_disk();
}

void EngineCore::resume(const nlohmann::json& state, std::shared_ptr<GenerationSink> sink) {
  try {
    scheduler_.enqueue(Sequence::restore(state, sink, tokenizer_, vocab_));
  } catch (const std::exception& e) {
    refuse(*sink, e);
  }
}

void EngineCore::report_load() {
  if (load_listener_) load_listener_(load());
}

bool EngineCore::step() {
  take_restored();
  if (!scheduler_.admit().empty()) report_load();
  const Timer timer;
  const double first_drafts = draft_running();
  StepPlan& plan = plan_;
  scheduler_.plan(plan);
  if (!plan.empty()) {
    try {
      run(plan);
      time_step(plan, timer.seconds() - first_drafts);
    } catch (const std::exception& e) {  // a failed step fails every sequence in it
      log::warn("step failed: {}", e.what());
      for (const PlannedEntry& entry : plan.entries) entry.seq->finish("error", e.what());
    }
  }
  checkpoint_running();
  std::vector<std::unique_ptr<Sequence>> ended = scheduler_.retire();
  const bool worked = !plan.empty() || !ended.empty();
  report_load();
  end(std::move(ended));
  return worked;
}

void EngineCore::run_until_idle() {
  while (!idle()) step();
}

bool EngineCore::draws_on_device(const StepPlan& plan) const {
  if (backends_[0]->host_memory()) return false;
  for (const PlannedEntry& e : plan.entries)
    if (e.kind == StepKind::kVerify || e.logits_rows > 1 || (e.draws && !e.seq->sampler().on_device()) ||
        e.seq->request().pooling != Pooling::kNone)
      return false;
  return true;
}

// The plan as the runner's entries, then the forward and its draws.
void EngineCore::run(const StepPlan& plan) {
  entries_.clear();
  int64_t rows = 0;
  step_drafts_ = 0;
  for (const PlannedEntry& e : plan.entries) {
    rows += e.logits_rows;
    if (e.kind == StepKind::kVerify) {  // a decode row per token: each gets the bits decoding it alone gives
      step_drafts_ += static_cast<int64_t>(e.tokens.size()) - 1;
      e.seq->kv->set_rollback_margin(static_cast<int64_t>(e.tokens.size()));
      for (size_t i = 0; i < e.tokens.size(); ++i)
        entries_.push_back({e.tokens.data() + i, 1, &*e.seq->kv, true, 1, static_cast<int64_t>(i)});
      continue;
    }
    entries_.push_back({e.tokens.data(), static_cast<int64_t>(e.tokens.size()), &*e.seq->kv,
                        e.kind == StepKind::kDecode, e.logits_rows});
  }
  if (draws_on_device(plan))
    run_drawing_on_device(plan, rows);
  else
    run_drawing_on_host(plan, rows);
}

// Only ids cross: each drawing row's rule (and its uniform) goes with the forward.
void EngineCore::run_drawing_on_device(const StepPlan& plan, int64_t rows) {
  sample_rows_.assign(static_cast<size_t>(rows), SampleRow{});  // rows that draw nothing: greedy, ignored
  for (size_t i = 0; i < plan.entries.size(); ++i)
    if (plan.entries[i].draws) sample_rows_[i] = plan.entries[i].seq->sampler().device_row();
  ids_.resize(static_cast<size_t>(rows));
  runner_->forward_batch(entries_, sample_rows_.data(), ids_.data(), [&] { return step_masks(plan, rows); });
  scheduler_.completed(plan);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const PlannedEntry& e = plan.entries[i];
    if (e.ends) e.seq->finish("length");
    if (!e.draws || e.seq->finished()) continue;  // finished: its grammar allowed nothing
    e.seq->sampler().accept(ids_[i]);
    e.seq->accept(SampledToken{ids_[i], 0.0f, {}}, model_.generation.eos_token_ids);
  }
}

// The logits come back; each sequence's sampler draws (penalties, bias, logprobs), verify
// rows are checked in order, scored prompts get their log-probabilities.
void EngineCore::run_drawing_on_host(const StepPlan& plan, int64_t rows) {
  if (logits_.size() < static_cast<size_t>(rows * width_)) logits_.resize(static_cast<size_t>(rows * width_));
  runner_->forward_batch(entries_, logits_.data());
  scheduler_.completed(plan);
  const float* row = logits_.data();
  for (const PlannedEntry& e : plan.entries) {
    const float* last = row + (e.logits_rows - 1) * width_;
    if (e.kind == StepKind::kVerify)
      verify(e, row);
    else if (e.seq->request().prompt_logprobs)
      score_prompt(e, row);
    else if (e.seq->request().pooling != Pooling::kNone)
      pool_rows(e, row);
    if (e.kind != StepKind::kVerify && e.draws) {
      const uint32_t* mask = host_mask(*e.seq);
      if (!e.seq->finished()) e.seq->accept(e.seq->sampler().sample(last, vocab_, mask), model_.generation.eos_token_ids);
    }
    if (e.ends) e.seq->finish("length");
    row += e.logits_rows * width_;
  }
}

// The chunk's rows: all its positions' (mean, CLS) or its last one's (last-token pooling).
void EngineCore::pool_rows(const PlannedEntry& entry, const float* hidden) {
  Sequence& seq = *entry.seq;
  const int64_t end = seq.fed();  // after the chunk (fed already counts it)
  entry.seq->pool(end - entry.logits_rows, hidden, entry.logits_rows, width_);
}

// A prompt chunk's rows score the prompt tokens after them: log-softmax in double of the
// raw logits (no sampling adjustments), as Hugging Face's perplexity recipe computes it.
void EngineCore::score_prompt(const PlannedEntry& entry, const float* logits) {
  Sequence& seq = *entry.seq;
  const auto n = static_cast<int64_t>(entry.tokens.size());
  const int64_t first = seq.fed() - n;  // the chunk's first position (fed already counts it)
  std::vector<double> scores;
  for (int64_t r = 0; r < n && first + r + 1 < seq.prompt_size(); ++r) {
    const float* row = logits + r * vocab_;
    const int32_t target = seq.request().prompt[static_cast<size_t>(first + r + 1)];
    const float max_logit = *std::max_element(row, row + vocab_);
    double sum = 0.0;
    for (int64_t v = 0; v < vocab_; ++v) sum += std::exp(static_cast<double>(row[v]) - max_logit);
    scores.push_back((static_cast<double>(row[target]) - max_logit) - std::log(sum));
  }
  if (!scores.empty()) seq.emit_prompt_logprobs(first, std::move(scores));
}

// Row i of a verify entry's logits follows its i-th token: drawn in order, each agreeing
// with the next draft lets that draft's KV stand and goes on.
void EngineCore::verify(const PlannedEntry& entry, const float* logits) {
  Sequence& seq = *entry.seq;
  const int64_t base = seq.fed() - static_cast<int64_t>(entry.tokens.size());  // before the step
  const auto drafts = static_cast<int64_t>(entry.tokens.size()) - 1;
  int64_t accepted = 0;
  for (int64_t i = 0; i <= drafts && !seq.finished(); ++i) {
    const uint32_t* mask = host_mask(seq);  // after the drafts accepted so far
    if (seq.finished()) break;
    const SampledToken t = seq.sampler().sample(logits + i * vocab_, vocab_, mask);
    seq.accept(t, model_.generation.eos_token_ids);
    if (i == drafts || t.id != entry.tokens[static_cast<size_t>(i + 1)]) break;
    ++accepted;
  }
  seq.speculation.verified(static_cast<int>(drafts), static_cast<int>(accepted), speculation_.max_drafts,
                           verify_cost(step_drafts_));
  speculation_.drafted += drafts;
  speculation_.accepted += accepted;
  ++speculation_.verifies;
  speculation_.emitted += seq.produced() - (base + 1 - seq.prompt_size());
  seq.draft().clear();
  seq.kv->set_rollback_margin(0);
  scheduler_.roll_back(seq, base + 1 + accepted);
}

void EngineCore::time_step(const StepPlan& plan, double seconds) {
  if (!speculating_) return;
  for (const PlannedEntry& e : plan.entries)
    if (e.kind == StepKind::kPrompt) return;  // prompt chunks would weigh in
  double& average = step_drafts_ > 0 ? verify_step_seconds_[static_cast<size_t>(std::min(step_drafts_, kTimedDrafts))]
                                     : decode_step_seconds_;
  average = average == 0.0 ? seconds : 0.9 * average + 0.1 * seconds;
}

double EngineCore::verify_cost(int64_t step_drafts) const {
  const double verify = verify_step_seconds_[static_cast<size_t>(std::min(step_drafts, kTimedDrafts))];
  return decode_step_seconds_ > 0.0 && verify > 0.0 ? verify / decode_step_seconds_ : 0.0;
}

// A sequence drafts when its next step is a decode and it may still produce two tokens or
// more (a verify of k drafts emits up to k + 1); at most what its DraftState asks for.
double EngineCore::draft_running() {
  if (!speculating_) return 0.0;
  double first = 0.0;
  for (const auto& seq : scheduler_.running_sequences()) {
    if (seq->finished() || !seq->decoding() || seq->pending() != 1 || !seq->draft().empty()) continue;
    const int64_t left = seq->request().max_tokens - seq->produced();
    const int k = static_cast<int>(std::min<int64_t>(seq->speculation.wanted(speculation_.max_drafts), left - 1));
    if (k <= 0) continue;
    const Timer timer;
    try {
      seq->draft() = drafter_->propose(*seq, k);
    } catch (const std::exception& e) {  // a drafter's failure costs the drafts, never the generation
      log::warn("speculation: no drafts this step: {}", e.what());
      seq->draft().clear();
    }
    if (seq->speculation.verifies == 0) first += timer.seconds();
  }
  return first;
}

const uint32_t* EngineCore::step_masks(const StepPlan& plan, int64_t rows) {
  std::vector<size_t> masked;
  for (size_t i = 0; i < plan.entries.size(); ++i)
    if (plan.entries[i].draws && plan.entries[i].seq->constrained()) masked.push_back(i);
  if (masked.empty()) return nullptr;
  const int64_t words = mask_words();
  masks_.assign(static_cast<size_t>(rows * words), 0xFFFFFFFFu);
  if (!mask_threads_) mask_threads_ = std::make_unique<ThreadPool>(std::min(8, ThreadPool::default_threads()));
  mask_threads_->parallel_for(static_cast<int64_t>(masked.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const size_t i = masked[static_cast<size_t>(k)];
      plan.entries[i].seq->fill_mask(std::span(masks_.data() + i * static_cast<size_t>(words), static_cast<size_t>(words)));
    }
  });
  return masks_.data();
}

const uint32_t* EngineCore::host_mask(Sequence& seq) {
  if (!seq.constrained()) return nullptr;
  masks_.resize(static_cast<size_t>(mask_words()));
  seq.fill_mask(masks_);
  return masks_.data();
}

void EngineCore::end(std::vector<std::unique_ptr<Sequence>> ended) {
  for (auto& seq : ended) {
    if (drafter_) drafter_->forget(*seq);
    GenerationEnd report = seq->end_report();
    report.speculative = drafter_ != nullptr;
    if (seq->checkpoint_key && report.ok()) {  // finished: its checkpoint goes; cancelled: kept
      SsdBlock forget;
      forget.op = SsdBlock::Op::kForget;
      forget.digest = *seq->checkpoint_key;
      tier_->save(std::move(forget));
    }
    if (report.finish_reason == "cancelled")
      log::info("generation cancelled after {} tokens: {}", report.completion_tokens, report.error);
    seq->sink().on_end(report);
  }
}

void EngineCore::drop_waiting(const std::string& reason) {
  std::vector<std::unique_ptr<Sequence>> dropped = scheduler_.drop_waiting(reason);
  report_load();
  end(std::move(dropped));
}

int64_t EngineCore::clear_prefix_cache() {
  int64_t n = prefix_cache_ ? prefix_cache_->clear() : 0;
  if (tier_) n += tier_->clear();
  return n;
}

EngineLoad EngineCore::load() const {
  EngineLoad load;
  load.running = scheduler_.running();
  load.queued = scheduler_.waiting();
  if (prefix_cache_) {
    const PrefixCacheStats s = prefix_cache_->stats();
    load.prefix_cache = {s.lookups, s.hits, s.cached_tokens, s.entries, s.bytes, s.held_bytes, s.capacity_bytes};
  }
  const KvPool& pool = *pool_;
  KvLoad& kv = load.kv;
  kv.block_size = pool.block_size();
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    if (!pool.has_kind(kind)) continue;
    kv.blocks_used += pool.used_blocks(kind);
    kv.blocks_free += pool.available_blocks(kind);
  }
  kv.bytes_used = pool.used_bytes();
  kv.bytes_allocated = pool.allocated_bytes();
  kv.bytes_reserved = scheduler_.kv_bytes_in_use();
  kv.budget_bytes = pool.max_bytes();
  kv.quant = kv_quant_name_;
  for (size_t i = 0; i < pool.layout().layers.size(); ++i) kv.bytes_per_token += pool.layout().token_bytes(i);
  if (tier_) {
    const SsdStats t = tier_->stats();
    load.ssd = {true,      t.spilling, t.scanning,        t.entries,       t.bytes,        t.max_bytes,
                t.hits,    t.restores, t.restore_bytes,   t.restore_seconds, t.written,    t.written_bytes,
                t.queued,  t.queued_bytes, t.dropped,     t.errors,        t.removed,
                t.checkpoints, t.checkpoints_written, t.resumed};
  }
  load.speculation = speculation_;
  return load;
}

GenerationResult generate(EngineCore& core, GenerationRequest request,
                          const std::function<void(const GenerationOutput&)>& on_output) {
  auto sink = std::make_shared<CollectingSink>(on_output);
  core.submit(std::move(request), sink);
  core.run_until_idle();
  return sink->result;
}

}  // namespace kettle
