// Scheduler: which sequences run and what each feeds the next step. Waiting
// sequences are admitted first in, first out while the batch has room and
// their worst-case KV (prompt + max_tokens, whole blocks) fits the pool's
// budget beside the running ones; an admitted one adopts the longest prefix the
// prefix cache holds for it. Each step's plan puts every decoding sequence
// first (one token, or a verify entry: its last token and k drafted ones,
// checked at once, k + 1 logits rows), then prompt chunks of the others, oldest
// first, up to `prefill_chunk` tokens in all, so a long prompt never stalls the
// running streams. Cancelled sequences end before the plan is made.
// Single-threaded: the engine thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "engine/sequence.h"
#include "kv/kv_pool.h"
#include "kv/prefix_cache.h"

namespace kettle {

enum class StepKind { kPrompt, kDecode, kVerify };

struct PlannedEntry {
  Sequence* seq = nullptr;
  StepKind kind = StepKind::kPrompt;
  // What this step feeds (a verify entry: the last token, then the drafts): a view of the
  // sequence's own tokens, valid until the sequence takes its next token.
  std::span<const int32_t> tokens;
  int64_t logits_rows = 1;      // the last rows whose logits come back (verify, prompt_logprobs: all of them)
  bool draws = false;           // its last row's logits draw the sequence's next token
  bool ends = false;            // the last of a prompt that is only scored (max_tokens 0): it ends here
};

struct StepPlan {
  std::vector<PlannedEntry> entries;  // decodes and verifies first, then prompt chunks
  bool empty() const { return entries.empty(); }
};

class Scheduler {
 public:
  struct Options {
    int batch = 8;                 // sequences running at once
    int64_t prefill_chunk = 2048;  // prompt tokens per step, beside the decodes
  };
  // The pool's admission budget (KvPool::admission_capacity) bounds the running
  // sequences' worst case; cache (optional) is the prefix cache they share.
  Scheduler(Options options, KvPool& pool, PrefixCache* cache);

  // A request whose worst case exceeds the whole budget can never run.
  bool can_ever_fit(int64_t tokens) const;
  size_t kv_bytes(int64_t tokens) const { return pool_.admission_bytes(tokens); }

  void enqueue(std::unique_ptr<Sequence> seq);
  // Admits waiting sequences in order while they fit (passing over those whose prefix is
  // still being read from disk); returns those admitted now.
  std::vector<Sequence*> admit();
  // The sequences waiting on `ticket` (SsdTier::restore) may be admitted.
  void restored(int64_t ticket);
  // The waiting sequence holding `ticket`, or null (it was cancelled meanwhile).
  Sequence* waiting_on(int64_t ticket);
  // Ends cancelled sequences (waiting ones too), then plans the next step of the others
  // into `plan` (its storage reused from step to step).
  void plan(StepPlan& plan);
  StepPlan plan() {
    StepPlan p;
    plan(p);
    return p;
  }
  // The sequences that ended (finished, cancelled or failed), out of the running set,
  // their KV released and their prefix offered to the cache (when they ended well).
  std::vector<std::unique_ptr<Sequence>> retire();
  // After a step that ran `plan`: records what each entry fed and offers prompt prefixes
  // to the prefix cache (concurrent requests may share them already).
  void completed(const StepPlan& plan);
  // Rolls a verified sequence back to `keep` positions (rejected drafts' KV let go).
  void roll_back(Sequence& seq, int64_t keep);

  // Every sequence waiting and running ends with `reason` (cancelled) at the next plan.
  void cancel_all(const std::string& reason);
  // Ends the waiting sequences now (error `reason`); returns them.
  std::vector<std::unique_ptr<Sequence>> drop_waiting(const std::string& reason);

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Something to run now: a running sequence, or a waiting one not reading its prefix.
  bool has_work() const;
  size_t kv_bytes_in_use() const { return kv_in_use_; }
  const std::vector<std::unique_ptr<Sequence>>& running_sequences() const { return running_; }

 private:
  void start(Sequence& seq);
  void remember_prefix(Sequence& seq, int64_t positions);

  Options options_;
  KvPool& pool_;
  PrefixCache* cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<std::unique_ptr<Sequence>> ended_;  // cancelled while waiting
  size_t kv_in_use_ = 0;
  std::string cancel_reason_;
  bool cancel_everything_ = false;
};

}  // namespace kettle
