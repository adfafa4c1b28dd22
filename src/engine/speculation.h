// Speculative decoding: before a step, a drafter proposes the next tokens of each
// decoding sequence (Sequence::draft); the step verifies them as decode rows (one per
// token, the bits decoding each alone gives), draws every row with the sequence's own
// sampler in order and keeps the drafts up to the first one the draw disagrees with
// (EngineCore::verify). Every emitted token is a draw from the target's distribution
// with the sampler's own random numbers, so greedy and seeded output are the tokens of
// decoding without speculation, and any sampled output is distributed as the target's.
//
// Kinds (--draft-kind): ngram (prompt lookup: the longest recent n-gram that occurred
// before in the context proposes what followed it) and model (a smaller model with the
// same vocabulary drafts greedily; draft_model.h). Each sequence adapts how many drafts
// it asks for to what it gets accepted, and stops drafting for a while where drafts do
// not pay (DraftState).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kettle {

class Sequence;

enum class DraftKind { kNone, kNgram, kModel };

struct SpeculationOptions {
  DraftKind kind = DraftKind::kNone;
  int num_draft_tokens = 0;  // the most drafts per step; 0: the kind's default (ngram 10, model 3)
  int ngram_max = 3, ngram_min = 1;  // n-gram lengths tried, longest first
  std::string draft_model;           // kind model: the draft's folder
  size_t draft_kv_bytes = 0;         // kind model: the draft's KV pool cap; 0: none (it grows)

  bool on() const { return kind != DraftKind::kNone; }
  int max_drafts() const { return num_draft_tokens > 0 ? num_draft_tokens : kind == DraftKind::kNgram ? 10 : 3; }
};

// "none" | "ngram" | "model"; anything else refused by name (kInvalidArgument).
DraftKind parse_draft_kind(const std::string& name);
const char* draft_kind_name(DraftKind kind);
// Refuses options that cannot run (ranges, a model kind without --draft-model, ...).
void check_speculation(const SpeculationOptions& options);

// One sequence's speculation: how many drafts it asks for next and what it got so far.
// The rule: k starts at min(max, 4); a verify that accepts every draft doubles k (up to
// max), one that rejects some asks for one more than it accepted next time. The sequence
// decodes plainly for a pause (8 steps, doubling up to 256 while drafting keeps not
// paying; back to 8 once it pays) after kMissesToPause verifies in a row that accept
// nothing, or when its verifies' worth — tokens a verify gave over what a verify of that
// many drafts costs in plain decode steps, drafting included (timed by the engine), a moving
// average over at least kJudgeAfter verifies — falls below 1. After a pause it probes with
// one draft. It starts with two plain decodes (the engine times them). So where drafts do
// not pay, verifies are a vanishing share of the steps.
struct DraftState {
  static constexpr int kMissesToPause = 2;
  static constexpr int kFirstPause = 8, kLongestPause = 256;
  static constexpr double kWorthWeight = 0.25;  // of the newest verify in the moving average
  static constexpr int kJudgeAfter = 3;          // verifies since a pause before their worth is judged
  static constexpr int kFirstPlainSteps = 2;     // plain decodes first: the engine times them
  int k = 0;  // 0: not started
  int misses = 0, paused = kFirstPlainSteps, next_pause = kFirstPause;
  double worth = 0.0;  // tokens per plain-step cost of its verifies, moving average since the last pause
  int judged = 0;      // verifies since the last pause
  int64_t drafted = 0, accepted = 0, verifies = 0;

  // The drafts to ask for before this step (0: none now: paused, or the cap is 0).
  int wanted(int max);
  // A verify of `drafted` drafts accepted the first `accepted`; cost: that verify step's cost
  // in plain decode steps (0: not known yet: not judged).
  void verified(int drafted, int accepted, int max, double cost = 0.0);

 private:
  void pause();
};

// Proposes drafts for sequences about to decode.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `k` drafted tokens following seq.tokens() (fewer or none when it has none).
  virtual std::vector<int32_t> propose(const Sequence& seq, int k) = 0;
  // The sequence ended: whatever the drafter keeps for it goes.
  virtual void forget(const Sequence& seq) { (void)seq; }
};

// Prompt lookup over the context (prompt and output): for n from ngram_max down to
// ngram_min, the context's last n tokens are searched for earlier in it and the tokens
// after an occurrence, up to k, are the drafts. Where the n-gram occurred more than once,
// the occurrence whose preceding tokens match the context's for longest (up to
// kNgramContextSpan more) proposes — in a document repeated with edits, or a loop, the
// same place, not just the latest "of the" — and the latest of equally long ones.
constexpr int64_t kNgramContextSpan = 32;
std::vector<int32_t> ngram_lookup(std::span<const int32_t> context, int k, int ngram_max, int ngram_min);

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int ngram_max, int ngram_min) : max_(ngram_max), min_(ngram_min) {}
  std::vector<int32_t> propose(const Sequence& seq, int k) override;

 private:
  int max_, min_;
};

}  // namespace kettle
