// The scheduler without HTTP and without a model: admission order and the KV
// budget, chunked prefill beside decodes, cancellation mid-prefill and
// mid-decode, prefix-cache adoption, verify entries and their roll-back. A
// fake step stands in for the runner (it reserves and advances the caches as a
// runner does); tokens are drawn by the test.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "util/error.h"

namespace kettle {
namespace {

constexpr int kBlock = 4;
constexpr int64_t kVocab = 1000;

KvLayout two_full_layers() {
  KvLayout layout;
  layout.kv_heads = 1;
  layout.head_dim = 4;
  layout.layers = {KvLayer{}, KvLayer{}};
  return layout;
}

std::vector<int32_t> range(int32_t first, int32_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

class Recorder final : public GenerationSink {
 public:
  void on_output(GenerationOutput) override {}
  void on_end(const GenerationEnd& e) override { end = e; }
  bool cancelled() const override { return cancel; }
  bool cancel = false;
  GenerationEnd end;
};

struct Queued {
  Sequence* seq;
  std::shared_ptr<Recorder> sink;
};

class SchedulerTest : public ::testing::Test {
 protected:
  Queued enqueue(Scheduler& s, std::vector<int32_t> prompt, int64_t max_tokens = 8) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    auto sink = std::make_shared<Recorder>();
    auto seq = std::make_unique<Sequence>(std::move(r), sink, nullptr, kVocab);
    Sequence* raw = seq.get();
    s.enqueue(std::move(seq));
    return {raw, sink};
  }
  // What a runner does with a plan, then the step's draws (token 7 for each).
  void fake_step(Scheduler& s, const StepPlan& plan) {
    for (const PlannedEntry& e : plan.entries) {
      const auto n = static_cast<int64_t>(e.tokens.size());
      e.seq->kv->reserve(e.seq->kv->length() + n);
      e.seq->kv->set_length(e.seq->kv->length() + n);
    }
    s.completed(plan);
    for (const PlannedEntry& e : plan.entries)
      if (e.draws && e.kind != StepKind::kVerify) e.seq->accept(SampledToken{7, 0.0f, {}}, {});
  }
  static std::vector<int32_t> fed(const PlannedEntry& e) { return {e.tokens.begin(), e.tokens.end()}; }
  std::vector<int64_t> sizes(const StepPlan& plan) {
    std::vector<int64_t> n;
    for (const PlannedEntry& e : plan.entries) n.push_back(static_cast<int64_t>(e.tokens.size()));
    return n;
  }

  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
  KvPool pool_{two_full_layers(), *backend_, KvPool::Options{kBlock, 0}};
};

TEST_F(SchedulerTest, AdmitsFirstInFirstOutUpToTheBatch) {
  Scheduler s({2, 100}, pool_, nullptr);
  Queued a = enqueue(s, range(0, 5)), b = enqueue(s, range(10, 5)), c = enqueue(s, range(20, 5));
  const std::vector<Sequence*> admitted = s.admit();
  ASSERT_EQ(admitted.size(), 2u);
  EXPECT_EQ(admitted[0], a.seq);
  EXPECT_EQ(admitted[1], b.seq);
  EXPECT_EQ(s.waiting(), 1);
  a.seq->finish("stop");
  s.retire();
  EXPECT_EQ(s.admit(), std::vector<Sequence*>{c.seq}) << "a place freed: the next in line joins";
}

TEST_F(SchedulerTest, TheKvBudgetHoldsBackWhatDoesNotFitAndRefusesWhatNeverCan) {
  const size_t block = pool_.bytes_per_block(KvPool::kFull);
  KvPool pool(two_full_layers(), *backend_, KvPool::Options{kBlock, 6 * block});  // 6 blocks to admit against
  Scheduler s({8, 100}, pool, nullptr);
  EXPECT_TRUE(s.can_ever_fit(24));
  EXPECT_FALSE(s.can_ever_fit(25)) << "7 blocks never fit in 6";
  Queued a = enqueue(s, range(0, 8), 8);  // 16 positions: 4 blocks
  Queued b = enqueue(s, range(0, 4), 4);  // 8 positions: 2 blocks — fits beside a
  Queued c = enqueue(s, range(0, 1), 3);  // 1 block: waits for room
  EXPECT_EQ(s.admit().size(), 2u);
  EXPECT_EQ(s.kv_bytes_in_use(), 6 * block);
  EXPECT_EQ(s.waiting(), 1) << "the third waits until the first two leave room";
  b.seq->finish("stop");
  s.retire();
  EXPECT_EQ(s.admit(), std::vector<Sequence*>{c.seq});
  (void)a;
}

TEST_F(SchedulerTest, PromptsPrefillInChunksBesideTheDecodes) {
  Scheduler s({4, 5}, pool_, nullptr);
  Queued a = enqueue(s, range(0, 3)), b = enqueue(s, range(100, 12));
  s.admit();
  StepPlan p1 = s.plan();
  EXPECT_EQ(sizes(p1), (std::vector<int64_t>{3, 2})) << "the oldest prompt whole, the next its share of 5";
  EXPECT_TRUE(p1.entries[0].draws);
  EXPECT_FALSE(p1.entries[1].draws);
  fake_step(s, p1);
  StepPlan p2 = s.plan();
  ASSERT_EQ(sizes(p2), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(p2.entries[0].kind, StepKind::kDecode) << "decodes first";
  EXPECT_EQ(p2.entries[0].seq, a.seq);
  EXPECT_EQ(fed(p2.entries[1]), range(102, 5));
  fake_step(s, p2);
  StepPlan p3 = s.plan();
  EXPECT_EQ(sizes(p3), (std::vector<int64_t>{1, 5}));
  EXPECT_TRUE(p3.entries[1].draws) << "the last chunk of b's prompt draws its first token";
  fake_step(s, p3);
  EXPECT_EQ(sizes(s.plan()), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(b.seq->fed(), 12);
}

TEST_F(SchedulerTest, CancelledSequencesEndMidPrefillAndMidDecodeAndGiveBackTheirBlocks) {
  Scheduler s({4, 4}, pool_, nullptr);
  Queued decoding = enqueue(s, range(0, 3)), prefilling = enqueue(s, range(50, 20)), waiting = enqueue(s, range(9, 2));
  s.admit();
  fake_step(s, s.plan());
  fake_step(s, s.plan());
  ASSERT_TRUE(decoding.seq->decoding());
  ASSERT_GT(prefilling.seq->fed(), 0);
  ASSERT_LT(prefilling.seq->fed(), 20);
  EXPECT_GT(pool_.used_blocks(KvPool::kFull), 0);
  decoding.sink->cancel = prefilling.sink->cancel = true;
  EXPECT_EQ(sizes(s.plan()), (std::vector<int64_t>{2})) << "only the third runs";
  auto ended = s.retire();
  ASSERT_EQ(ended.size(), 2u);
  for (const auto& seq : ended) EXPECT_EQ(seq->finish_reason(), "cancelled");
  EXPECT_EQ(s.running(), 1);
  (void)waiting;
  s.cancel_all("shutting down");
  s.plan();
  ended = s.retire();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0]->end_report().error, "shutting down");
  EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 0) << "every block came back";
  EXPECT_TRUE(s.idle());
}

TEST_F(SchedulerTest, AnAdmittedSequenceAdoptsTheCachedPrefix) {
  PrefixCache cache(pool_, 1 << 20);
  Scheduler s({4, 100}, pool_, &cache);
  Queued first = enqueue(s, range(0, 10), 1);
  s.admit();
  fake_step(s, s.plan());  // the prompt, and its one token: it ends
  ASSERT_TRUE(first.seq->finished());
  s.retire();
  Queued second = enqueue(s, range(0, 13));
  s.admit();
  EXPECT_EQ(second.seq->cached_tokens, 8) << "two whole blocks of the first prompt";
  EXPECT_EQ(second.seq->fed(), 8);
  EXPECT_EQ(fed(s.plan().entries.at(0)), range(8, 5)) << "only the rest is prefilled";
}

TEST_F(SchedulerTest, DraftsAreVerifiedInOneEntryAndRejectedOnesRolledBack) {
  Scheduler s({4, 100}, pool_, nullptr);
  Queued plain = enqueue(s, range(0, 3)), drafted = enqueue(s, range(10, 6));
  s.admit();
  fake_step(s, s.plan());
  Queued joining = enqueue(s, range(40, 2));
  s.admit();
  drafted.seq->draft() = {101, 102, 103};
  const StepPlan plan = s.plan();
  ASSERT_EQ(plan.entries.size(), 3u);
  EXPECT_EQ(plan.entries[0].kind, StepKind::kDecode);
  EXPECT_EQ(plan.entries[1].kind, StepKind::kVerify) << "after the decodes, before the prompts";
  EXPECT_EQ(plan.entries[2].kind, StepKind::kPrompt);
  EXPECT_EQ(fed(plan.entries[1]), (std::vector<int32_t>{7, 101, 102, 103}));
  EXPECT_EQ(plan.entries[1].logits_rows, 4);
  fake_step(s, plan);
  EXPECT_EQ(drafted.seq->kv->length(), 10);
  drafted.seq->accept(SampledToken{101, 0.0f, {}}, {});  // the first draft agreed, then another token
  drafted.seq->accept(SampledToken{55, 0.0f, {}}, {});
  s.roll_back(*drafted.seq, 6 + 1 + 1);
  EXPECT_EQ(drafted.seq->kv->length(), 8);
  EXPECT_EQ(drafted.seq->pending(), 1) << "decoding again from the token drawn last";
  EXPECT_EQ(drafted.seq->kv->table(KvPool::kFull).size(), 2u) << "the block of the rejected tail went back";
  (void)plain;
  (void)joining;
}

}  // namespace
}  // namespace kettle
