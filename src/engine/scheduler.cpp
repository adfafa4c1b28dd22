// Admission (FIFO under the batch size and the KV budget), prefix adoption,
// step plans (decodes and verifies first, then prompt chunks under the chunk
// budget), and the end of a sequence (its prefix offered to the cache, its KV
// and its hold let go).
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>

namespace kettle {

Scheduler::Scheduler(Options options, KvPool& pool, PrefixCache* cache)
    : options_{std::max(1, options.batch), std::max<int64_t>(1, options.prefill_chunk)}, pool_(pool), cache_(cache) {}

bool Scheduler::can_ever_fit(int64_t tokens) const {
  const size_t capacity = pool_.admission_capacity();
  return capacity == 0 || kv_bytes(tokens) <= capacity;
}

void Scheduler::enqueue(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

std::vector<Sequence*> Scheduler::admit() {
  std::vector<Sequence*> admitted;
  for (auto it = waiting_.begin(); it != waiting_.end() && static_cast<int>(running_.size()) < options_.batch;) {
    Sequence& next = **it;
    if (next.restore_ticket != 0) {  // its prefix comes back from disk first; the others go on
      ++it;
      continue;
    }
    // The oldest waits until its worst case fits beside the running ones (one that could
    // never fit is refused before it is queued).
    const size_t need = kv_bytes(next.prompt_size() + next.request().max_tokens);
    const size_t capacity = pool_.admission_capacity();
    if (capacity > 0 && !running_.empty() && kv_in_use_ + need > capacity) break;
    kv_in_use_ += need;
    next.kv_reserved = need;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    start(next);
    admitted.push_back(&next);
  }
  return admitted;
}

void Scheduler::restored(int64_t ticket) {
  for (auto& seq : waiting_)
    if (seq->restore_ticket == ticket) seq->restore_ticket = 0;
}

Sequence* Scheduler::waiting_on(int64_t ticket) {
  for (auto& seq : waiting_)
    if (seq->restore_ticket == ticket) return seq.get();
  return nullptr;
}

bool Scheduler::has_work() const {
  return !running_.empty() ||
         std::any_of(waiting_.begin(), waiting_.end(), [](const auto& seq) { return seq->restore_ticket == 0; });
}

void Scheduler::start(Sequence& seq) {
  seq.queue_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - seq.request().submitted).count();
  seq.started();
  seq.kv.emplace(pool_);
  if (cache_ == nullptr || seq.reads_every_prompt_row()) return;  // every position is to be run
  PrefixCache::Match hit = cache_->match(seq.tokens(), seq.request().cache_scope);
  if (hit.tokens == 0) return;
  seq.kv->adopt(hit.blocks, hit.tokens);
  seq.prefix_hold = std::move(hit.hold);
  seq.cached_tokens = std::min(hit.tokens, seq.prompt_size());
  seq.advance(hit.tokens);
}

void Scheduler::cancel_all(const std::string& reason) {
  cancel_everything_ = true;
  cancel_reason_ = reason;
}

void Scheduler::plan(StepPlan& plan) {
  const std::string reason = cancel_everything_ ? cancel_reason_ : "the client disconnected";
  auto cancelled = [&](const Sequence& s) { return cancel_everything_ || s.sink().cancelled(); };
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!cancelled(**it)) {
      ++it;
      continue;
    }
    (*it)->finish("cancelled", reason);
    ended_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
  for (auto& seq : running_)
    if (!seq->finished() && cancelled(*seq)) seq->finish("cancelled", reason);  // stops within one step
  cancel_everything_ = false;

  // Decodes, then verifies (the runner takes one-token decodes first), then prompt chunks.
  plan.entries.clear();
  for (const bool drafted : {false, true})
    for (auto& seq : running_) {
      if (seq->finished() || !seq->decoding() || seq->pending() != 1 || seq->draft().empty() != !drafted) continue;
      const std::span<const int32_t> fed =
          drafted ? seq->verify_input() : std::span<const int32_t>(seq->tokens()).last(1);
      plan.entries.push_back({seq.get(), drafted ? StepKind::kVerify : StepKind::kDecode, fed,
                              static_cast<int64_t>(fed.size()), true});
    }
  int64_t budget = options_.prefill_chunk;
  for (auto& seq : running_) {
    if (seq->finished() || (seq->decoding() && seq->pending() == 1)) continue;
    const int64_t n = std::min(seq->pending(), budget);
    if (n == 0) break;  // the rest wait for the next step's budget
    budget -= n;
    const bool last = n == seq->pending();
    plan.entries.push_back({seq.get(), StepKind::kPrompt,
                            std::span<const int32_t>(seq->tokens()).subspan(static_cast<size_t>(seq->fed()),
                                                                            static_cast<size_t>(n)),
                            seq->reads_every_prompt_row() ? n : 1, last && seq->request().max_tokens > 0,
                            last && seq->request().max_tokens == 0});
  }
}

void Scheduler::completed(const StepPlan& plan) {
  for (const PlannedEntry& e : plan.entries) {
    e.seq->advance(static_cast<int64_t>(e.tokens.size()));
    if (e.kind == StepKind::kPrompt) remember_prefix(*e.seq, e.seq->fed());
  }
}

void Scheduler::roll_back(Sequence& seq, int64_t keep) {
  seq.kv->truncate(keep);
  seq.rewind(keep);
}

void Scheduler::remember_prefix(Sequence& seq, int64_t positions) {
  if (cache_ == nullptr) return;
  const auto n = static_cast<size_t>(std::min<int64_t>(positions, static_cast<int64_t>(seq.tokens().size())));
  cache_->insert(std::span<const int32_t>(seq.tokens().data(), n), *seq.kv, seq.request().cache_scope, seq.prefix_hold);
}

std::vector<std::unique_ptr<Sequence>> Scheduler::retire() {
  std::vector<std::unique_ptr<Sequence>> ended = std::move(ended_);
  ended_.clear();
  for (auto& seq : running_) {
    if (!seq->finished()) continue;
    // The KV holds the context but its last token: that much is offered to the cache.
    if (seq->finish_reason() == "stop" || seq->finish_reason() == "length") remember_prefix(*seq, seq->kv->length());
    seq->prefix_hold.release();
    seq->kv.reset();  // its blocks go back (the cache keeps what it shares)
    kv_in_use_ -= seq->kv_reserved;
    ended.push_back(std::move(seq));
  }
  std::erase_if(running_, [](const auto& seq) { return seq == nullptr; });
  return ended;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::drop_waiting(const std::string& reason) {
  std::vector<std::unique_ptr<Sequence>> dropped;
  for (auto& seq : waiting_) {
    seq->finish("error", reason);
    dropped.push_back(std::move(seq));
  }
  waiting_.clear();
  return dropped;
}

}  // namespace kettle
