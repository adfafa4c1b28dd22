// The engine thread's loop: take queued jobs while there is room in the batch,
// prefill each (after the prefix cache lends what it has), then advance every
// running sequence by one token in one batched forward; tokens → text with
// StreamDecoder, stop strings with StopMatcher, one event per emitted piece.
// A cancelled channel ends its sequence before the next step.
#include "server/engine_worker.h"

#include <algorithm>
#include <chrono>

#include "engine/generator.h"
#include "tokenizer/stream_decoder.h"
#include "util/error.h"
#include "util/log.h"
#include "util/timer.h"

namespace kettle::server {

struct EngineWorker::Sequence {
  Sequence(Job j, KvCache cache, const Tokenizer& tokenizer)
      : job(std::move(j)), kv(std::move(cache)), sampler(job.sampling), decoder(tokenizer), matcher(job.stop) {}

  Job job;
  KvCache kv;
  Sampler sampler;
  StreamDecoder decoder;
  StopMatcher matcher;
  std::vector<int32_t> output;
  int32_t next = 0;  // the last sampled token: the input of the next step
  int64_t cached_tokens = 0;
  int64_t prefilled = 0;  // prompt tokens whose KV is in kv (cached ones included)
  Timer since_joined;
  double queue_seconds = 0.0, prefill_seconds = 0.0;
  Timer since_first_token;
  std::string finish_reason;  // set once the sequence is over: "stop", "length" or "cancelled"
  size_t kv_reserved = 0;     // bytes admitted against the KV budget
};

EngineWorker::EngineWorker(const Model& model, const Tokenizer& tokenizer,
                           std::vector<std::unique_ptr<Backend>> backends, Options options)
    : model_(model),
      tokenizer_(tokenizer),
      backends_(std::move(backends)),
      batch_(std::max(1, options.batch)),
      prefill_chunk_(std::max<int64_t>(1, options.prefill_chunk)),
      kv_budget_bytes_(options.kv_budget_bytes) {
  runner_ = make_model_runner(model_, backend_pointers(backends_),
                              KvPool::Options{options.kv_block_size, kv_budget_bytes_, batch_, prefill_chunk_});
  if (!backends_[0]->host_memory()) {  // a GPU reserves its KV memory now, as vLLM does
    if (kv_budget_bytes_ == 0) {   // 90 % of what the weights left, past some working memory
      const size_t free = backends_[0]->free_memory(), working = size_t{4} << 30;
      kv_budget_bytes_ = free > 2 * working ? static_cast<size_t>(static_cast<double>(free - working) * 0.9) : free / 2;
      runner_->kv_pool().set_max_bytes(kv_budget_bytes_);
    }
    runner_->kv_pool().preallocate();
  }
  logits_.resize(static_cast<size_t>(batch_ * model_.spec.vocab_size));
  // A RoPE that changes with the sequence length (dynamic NTK) rotates cached keys for
  // another length than a fresh run would: no reuse for those models.
  bool length_dependent = false;
  for (const RopeSpec& rope : model_.spec.ropes) length_dependent = length_dependent || rope_depends_on_length(rope);
  if (options.prompt_cache_bytes > 0 && !length_dependent) {
    prefix_cache_.emplace(runner_->kv_pool(), options.prompt_cache_bytes);
    // Out of free blocks, the pool takes back cached ones (least recently used first).
    runner_->kv_pool().set_reclaimer([this] {
      std::lock_guard lock(mutex_);
      return prefix_cache_->evict_one();
    });
  }
  thread_ = std::thread([this] { loop(); });
}

EngineWorker::~EngineWorker() { stop(); }

void EngineWorker::submit(Job job) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(job));
      wake_.notify_one();
      return;
    }
  }
  job.channel->push(Event::error("the server is shutting down"));
}

// The worst case: every block of the sequence its own (lent prefix blocks counted too,
// so the pool's cap holds whatever the prefix cache lets go of); window layers hold
// their window plus one prefill chunk.
size_t EngineWorker::kv_admission_capacity() const { return runner_->kv_pool().admission_capacity(); }

size_t EngineWorker::kv_bytes(int64_t tokens) const {
  return runner_->kv_pool().admission_bytes(tokens);
}

int64_t EngineWorker::flush_prefix_cache() {
  std::lock_guard lock(mutex_);
  return prefix_cache_ ? prefix_cache_->clear() : 0;
}

EngineLoad EngineWorker::load() {
  std::lock_guard lock(mutex_);
  return {static_cast<int>(running_.size()), static_cast<int>(queue_.size()),
          prefix_cache_ ? prefix_cache_->stats() : PrefixCacheStats{}, kv_bytes_in_use_, kv_budget_bytes_, kv_stats_};
}

// The pool is the engine thread's; /stats reads this copy, refreshed after each step.
void EngineWorker::publish_kv_stats() {
  const KvPool& pool = runner_->kv_pool();
  KvPoolStats stats;
  stats.block_size = pool.block_size();
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    if (!pool.has_kind(kind)) continue;
    stats.blocks_used += pool.used_blocks(kind);
    stats.blocks_free += pool.available_blocks(kind);
  }
  stats.bytes_used = pool.used_bytes();
  stats.bytes_allocated = pool.allocated_bytes();
  std::lock_guard lock(mutex_);
  kv_stats_ = stats;
}

void EngineWorker::cancel_all(const std::string& reason) {
  std::lock_guard lock(mutex_);
  cancel_reason_ = reason;
  for (auto& channel : running_) channel->cancel();
  for (Job& job : queue_) job.channel->cancel();
}

void EngineWorker::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Jobs that fit in the batch (waiting for one when `block`); while stopping, queued
// jobs are failed instead. Empty and stopping with nothing queued: the loop ends.
std::vector<Job> EngineWorker::take_jobs(bool block) {
  std::unique_lock lock(mutex_);
  if (block) wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  std::vector<Job> jobs;
  while (!queue_.empty() && static_cast<int>(running_.size()) < batch_) {
    if (stopping_) {
      queue_.front().channel->push(Event::error("the server is shutting down"));
      queue_.pop_front();
      continue;
    }
    // FIFO: the oldest job waits until its KV fits beside the running ones (a job that
    // could never fit was refused with 400 before it was queued).
    const size_t need = kv_bytes(static_cast<int64_t>(queue_.front().prompt.size()) + queue_.front().max_tokens);
    const size_t capacity = kv_admission_capacity();
    if (capacity > 0 && !running_.empty() && kv_bytes_in_use_ + need > capacity) break;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    kv_bytes_in_use_ += need;
    job.kv_reserved = need;
    running_.push_back(job.channel);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void EngineWorker::release(const std::shared_ptr<EventChannel>& channel, size_t kv_reserved) {
  {
    std::lock_guard lock(mutex_);
    std::erase(running_, channel);
    kv_bytes_in_use_ -= kv_reserved;
  }
  wake_.notify_one();
}

void EngineWorker::loop() {
  std::vector<std::unique_ptr<Sequence>> active;
  for (;;) {
    std::vector<Job> jobs = take_jobs(active.empty());
    if (active.empty() && jobs.empty()) {
      std::lock_guard lock(mutex_);
      if (stopping_ && queue_.empty()) return;
      continue;
    }
    for (Job& job : jobs) {
      std::shared_ptr<EventChannel> channel = job.channel;
      const size_t reserved = job.kv_reserved;
      try {
        active.push_back(start(std::move(job)));
      } catch (const std::exception& e) {
        log::warn("request failed: {}", e.what());
        channel->push(Event::error(e.what()));
        release(channel, reserved);
      }
    }
    if (active.empty()) continue;
    try {
      step(active);
    } catch (const std::exception& e) {  // a failed step fails every sequence in it
      log::warn("step failed: {}", e.what());
      for (auto& seq : active) {
        seq->job.channel->push(Event::error(e.what()));
        release(seq->job.channel, seq->job.kv_reserved);
      }
      active.clear();
      continue;
    }
    for (auto& seq : active)
      if (!seq->finish_reason.empty()) finish(*seq);
    std::erase_if(active, [](const auto& seq) { return !seq->finish_reason.empty(); });
    publish_kv_stats();
  }
}

std::unique_ptr<EngineWorker::Sequence> EngineWorker::start(Job job) {
  const ModelSpec& spec = model_.spec;
  for (size_t i = 0; i < job.prompt.size(); ++i)
    if (job.prompt[i] < 0 || job.prompt[i] >= spec.vocab_size)
      fail(ErrorCategory::kInvalidArgument, "prompt token {} (position {}) is outside the model's vocabulary [0, {})",
           job.prompt[i], i, spec.vocab_size);
  validate_sampling(job.sampling, spec.vocab_size);
  const double queue_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.submitted).count();
  KvCache kv = runner_->new_cache();
  if (prefix_cache_) {
    std::lock_guard lock(mutex_);
    PrefixCache::Match hit = prefix_cache_->match(job.prompt, job.cache_scope);
    if (hit.tokens > 0) kv.adopt(hit.blocks, hit.tokens);
  }
  auto seq = std::make_unique<Sequence>(std::move(job), std::move(kv), tokenizer_);
  seq->queue_seconds = queue_seconds;
  seq->cached_tokens = seq->kv.length();
  seq->prefilled = seq->cached_tokens;
  seq->sampler.start(seq->job.prompt, spec.vocab_size, seq->job.max_tokens);
  return seq;
}

// One batched forward: a token for every decoding sequence, and prompt chunks of the
// joining ones (oldest first) up to prefill_chunk tokens in all. A sequence whose prompt
// is complete after this step samples its first token from the step's logits.
void EngineWorker::step(std::vector<std::unique_ptr<Sequence>>& active) {
  for (auto& seq : active)
    if (seq->job.channel->cancelled()) seq->finish_reason = "cancelled";  // stops within one step
  entries_.clear();
  stepped_.clear();
  // Decoding sequences first: consecutive one-token entries share one attention call.
  for (auto& seq : active) {
    if (!seq->finish_reason.empty() || seq->prefilled < static_cast<int64_t>(seq->job.prompt.size())) continue;
    entries_.push_back({&seq->next, 1, &seq->kv, true});
    stepped_.push_back(seq.get());
  }
  int64_t prefill_budget = prefill_chunk_;
  for (auto& seq : active) {
    const auto prompt = static_cast<int64_t>(seq->job.prompt.size());
    if (!seq->finish_reason.empty() || seq->prefilled == prompt) continue;
    const int64_t n = std::min(prompt - seq->prefilled, prefill_budget);
    if (n == 0) break;  // the rest wait for the next step's budget
    prefill_budget -= n;
    entries_.push_back({seq->job.prompt.data() + seq->prefilled, n, &seq->kv});
    stepped_.push_back(seq.get());
  }
  if (entries_.empty()) return;
  run_entries();
  for (size_t i = 0; i < stepped_.size(); ++i) {
    Sequence& seq = *stepped_[i];
    const bool prefilling = seq.prefilled < static_cast<int64_t>(seq.job.prompt.size());
    if (prefilling) {
      seq.prefilled += entries_[i].n;
      remember_prefix(seq, seq.prefilled);  // a concurrent request may share it already
      if (seq.prefilled < static_cast<int64_t>(seq.job.prompt.size())) continue;  // more prompt to come
    }
    if (seq.output.empty()) {
      seq.prefill_seconds = seq.since_joined.seconds();
      seq.since_first_token.reset();
    }
    accept(seq, sampled_[i]);
  }
}

// The step's forward and its sampling: on a device, when no entry needs its logits on
// the host (penalties, bias, logprobs), the tokens are drawn there and only ids come back.
void EngineWorker::run_entries() {
  const int64_t vocab = model_.spec.vocab_size;
  sampled_.assign(entries_.size(), SampledToken{});
  bool on_device = !backends_[0]->host_memory();
  for (size_t i = 0; i < stepped_.size(); ++i)
    on_device = on_device && stepped_[i]->sampler.on_device();
  if (on_device) {
    sample_rows_.assign(entries_.size(), SampleRow{});  // mid-prompt rows: greedy, ignored
    for (size_t i = 0; i < stepped_.size(); ++i)
      if (completes_prompt(*stepped_[i], entries_[i].n)) sample_rows_[i] = stepped_[i]->sampler.device_row();
    ids_.resize(entries_.size());
    runner_->forward_batch(entries_, sample_rows_.data(), ids_.data());
    for (size_t i = 0; i < stepped_.size(); ++i) {
      sampled_[i].id = ids_[i];
      if (completes_prompt(*stepped_[i], entries_[i].n)) stepped_[i]->sampler.accept(ids_[i]);
    }
    return;
  }
  runner_->forward_batch(entries_, logits_.data());
  for (size_t i = 0; i < stepped_.size(); ++i)
    if (completes_prompt(*stepped_[i], entries_[i].n))
      sampled_[i] = stepped_[i]->sampler.sample(logits_.data() + static_cast<int64_t>(i) * vocab, vocab);
}

// True when this step's tokens of `seq` end its prompt (or it is decoding): the step's
// logits give its next token.
bool EngineWorker::completes_prompt(const Sequence& seq, int64_t n) const {
  return seq.prefilled + n >= static_cast<int64_t>(seq.job.prompt.size());
}

void EngineWorker::remember_prefix(const Sequence& seq, int64_t tokens) {
  if (!prefix_cache_) return;
  std::vector<int32_t> known = seq.job.prompt;
  known.insert(known.end(), seq.output.begin(), seq.output.end());
  known.resize(static_cast<size_t>(std::min<int64_t>(tokens, static_cast<int64_t>(known.size()))));
  std::lock_guard lock(mutex_);
  prefix_cache_->insert(known, seq.kv, seq.job.cache_scope);
}

void EngineWorker::emit(Sequence& seq, std::string text, std::vector<TokenLogprob> logprobs) {
  if (text.empty() && logprobs.empty()) return;
  Event e;
  e.text = std::move(text);
  e.logprobs = std::move(logprobs);
  seq.job.channel->push(std::move(e));
}

// One sampled token: its text (held back while a stop string may be forming), then
// whether the sequence ends (an end-of-sequence id, a stop string, max_tokens).
void EngineWorker::accept(Sequence& seq, const SampledToken& sampled) {
  const int32_t token = sampled.id;
  seq.output.push_back(token);
  seq.next = token;
  const std::vector<int>& eos = model_.generation.eos_token_ids;
  if (!seq.job.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
    seq.finish_reason = "stop";
    return;
  }
  std::vector<TokenLogprob> logprobs;
  if (seq.job.sampling.logprobs) {
    auto text_of = [&](int32_t id) { return tokenizer_.decode({id}); };
    TokenLogprob lp{token, text_of(token), sampled.logprob, {}};
    for (const kettle::TokenLogprob& alt : sampled.top) lp.top.push_back({alt.id, text_of(alt.id), alt.logprob});
    logprobs.push_back(std::move(lp));
  }
  emit(seq, seq.matcher.push(seq.decoder.push(token)), std::move(logprobs));
  if (seq.matcher.stopped())
    seq.finish_reason = "stop";
  else if (static_cast<int64_t>(seq.output.size()) >= seq.job.max_tokens)
    seq.finish_reason = "length";
}

void EngineWorker::finish(Sequence& seq) {
  EventChannel& channel = *seq.job.channel;
  Event last;
  if (seq.finish_reason == "cancelled" || channel.cancelled()) {
    std::string reason;
    {
      std::lock_guard lock(mutex_);
      reason = cancel_reason_.empty() ? "the client disconnected" : cancel_reason_;
    }
    log::info("generation cancelled after {} tokens: {}", seq.output.size(), reason);
    last = Event::error("generation cancelled: " + reason);
  } else {
    last.kind = Event::Kind::kDone;
    last.finish_reason = seq.finish_reason;
    if (seq.matcher.stopped()) {
      last.stop_sequence = seq.matcher.matched();
    } else {
      emit(seq, seq.matcher.push(seq.decoder.finish()));
      emit(seq, seq.matcher.finish());
    }
    last.prompt_tokens = static_cast<int64_t>(seq.job.prompt.size());
    last.completion_tokens = static_cast<int64_t>(seq.output.size());
    last.cached_tokens = seq.cached_tokens;
    last.queue_seconds = seq.queue_seconds;
    last.prefill_seconds = seq.prefill_seconds;
    last.decode_seconds = seq.output.size() > 1 ? seq.since_first_token.seconds() : 0.0;
  }
  // The KV holds the prompt and every sampled token but the last. The prefix is cached and
  // the sequence released before its client hears the end, so what the client does next
  // (/stats, the next turn) already sees it done.
  if (seq.finish_reason != "cancelled") remember_prefix(seq, seq.kv.length());
  seq.kv.clear();
  std::shared_ptr<EventChannel> held = seq.job.channel;
  release(held, seq.job.kv_reserved);
  held->push(std::move(last));
}

}  // namespace kettle::server
