#include "engine/speculation.h"

#include <algorithm>

#include "engine/sequence.h"
#include "util/error.h"

namespace kettle {

DraftKind parse_draft_kind(const std::string& name) {
  if (name == "none" || name.empty()) return DraftKind::kNone;
  if (name == "ngram") return DraftKind::kNgram;
  if (name == "model") return DraftKind::kModel;
  if (name == "head")
    fail(ErrorCategory::kUnsupported, "--draft-kind head: no draft head is trained for kettle yet (use ngram or model)");
  fail(ErrorCategory::kInvalidArgument, "--draft-kind '{}': expected none, ngram or model", name);
}

const char* draft_kind_name(DraftKind kind) {
  switch (kind) {
    case DraftKind::kNgram: return "ngram";
    case DraftKind::kModel: return "model";
    case DraftKind::kNone: break;
  }
  return "none";
}

void check_speculation(const SpeculationOptions& o) {
  if (o.num_draft_tokens < 0 || o.num_draft_tokens > 32)
    fail(ErrorCategory::kInvalidArgument, "--num-draft-tokens {}: expected 1 to 32", o.num_draft_tokens);
  if (o.ngram_min < 1 || o.ngram_max < o.ngram_min || o.ngram_max > 16)
    fail(ErrorCategory::kInvalidArgument, "--ngram-min {} / --ngram-max {}: expected 1 ≤ min ≤ max ≤ 16", o.ngram_min,
         o.ngram_max);
  if (o.kind == DraftKind::kModel && o.draft_model.empty())
    fail(ErrorCategory::kInvalidArgument, "--draft-kind model needs --draft-model DIR (a smaller model with the same vocabulary)");
  if (o.kind != DraftKind::kModel && !o.draft_model.empty())
    fail(ErrorCategory::kInvalidArgument, "--draft-model is used by --draft-kind model only (given: --draft-kind {})",
         draft_kind_name(o.kind));
}

int DraftState::wanted(int max) {
  if (max <= 0) return 0;
  if (paused > 0) {
    --paused;
    return 0;
  }
  if (k == 0) k = std::min(max, 4);
  return std::min(k, max);
}

void DraftState::verified(int n_drafted, int n_accepted, int max, double cost) {
  drafted += n_drafted;
  accepted += n_accepted;
  ++verifies;
  k = n_accepted == n_drafted ? std::min(max, std::max(1, 2 * k)) : std::max(1, n_accepted + 1);
  misses = n_accepted > 0 ? 0 : misses + 1;
  if (cost > 0.0) {
    const double w = (1.0 + n_accepted) / cost;
    worth = judged++ == 0 ? w : (1.0 - kWorthWeight) * worth + kWorthWeight * w;
  }
  if (misses >= kMissesToPause || (judged >= kJudgeAfter && worth < 1.0)) {
    pause();
    return;
  }
  if (n_accepted > 0 && (judged == 0 || worth >= 1.0)) next_pause = kFirstPause;
}

void DraftState::pause() {
  misses = 0;
  worth = 0.0;
  judged = 0;
  k = 1;  // the next probe is cheap
  paused = next_pause;
  next_pause = std::min(kLongestPause, 2 * next_pause);
}

std::vector<int32_t> ngram_lookup(std::span<const int32_t> context, int k, int ngram_max, int ngram_min) {
  const auto len = static_cast<int64_t>(context.size());
  for (int64_t n = std::min<int64_t>(ngram_max, len - 1); n >= ngram_min; --n) {
    const std::span<const int32_t> suffix = context.last(static_cast<size_t>(n));
    // Of the earlier occurrences (each starts before the suffix does, so a token follows it), the
    // one whose preceding tokens go on matching the context's furthest; the latest among equals.
    int64_t best = -1, best_reach = -1;
    for (int64_t i = len - n - 1; i >= 0 && best_reach < kNgramContextSpan; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + i)) continue;
      int64_t reach = 0;
      while (reach < kNgramContextSpan && i - 1 - reach >= 0 && context[i - 1 - reach] == context[len - n - 1 - reach])
        ++reach;
      if (reach > best_reach) best = i, best_reach = reach;
    }
    if (best < 0) continue;
    const int64_t from = best + n, to = std::min(len, from + k);
    return {context.begin() + from, context.begin() + to};
  }
  return {};
}

std::vector<int32_t> NgramDrafter::propose(const Sequence& seq, int k) {
  return ngram_lookup(seq.tokens(), k, max_, min_);
}

}  // namespace kettle
