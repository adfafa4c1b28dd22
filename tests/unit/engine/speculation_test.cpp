// Speculative decoding on a tiny real checkpoint (CPU): the n-gram lookup's proposals,
// the per-sequence draft rule, and the engine with each drafter giving the tokens of
// decoding without speculation (greedy and seeded), and the target's distribution when
// sampled (a chi-square test against the target's own probabilities).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "engine/speculation.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "support/token_sink.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;

std::string golden_model(const std::string& name) {
  return (fs::path(KETTLE_TEST_DATA) / "goldens" / name / "model").string();
}

TEST(NgramLookup, TheLongestLatestMatchProposesWhatFollowedIt) {
  // "a b c d a b c" ends with "a b c", seen at 0: d, then what follows it.
  const std::vector<int32_t> ctx = {1, 2, 3, 4, 1, 2, 3};
  EXPECT_EQ(ngram_lookup(ctx, 3, 3, 1), (std::vector<int32_t>{4, 1, 2}));
  EXPECT_EQ(ngram_lookup(ctx, 10, 3, 1), (std::vector<int32_t>{4, 1, 2, 3}));  // up to the context's end
  // The latest occurrence wins: "9 5" then "7 5" — the suffix "5" last followed 7.
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{5, 9, 5, 7, 5}, 2, 3, 1), (std::vector<int32_t>{7, 5}));
  // A longer match is preferred to a later shorter one: "1 2" seen at 0 (then 8), "2" later (then 6).
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{1, 2, 8, 2, 6, 1, 2}, 1, 3, 1), (std::vector<int32_t>{8}));
  // Of two earlier "2 3"s, the one whose preceding token also matches (5, then 8) beats the later (6, then 9).
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{5, 2, 3, 8, 6, 2, 3, 9, 5, 2, 3}, 2, 2, 1), (std::vector<int32_t>{8, 6}));
  // ... and reaching further back decides between matches that agree on one token more.
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{4, 5, 2, 3, 8, 1, 5, 2, 3, 9, 4, 5, 2, 3}, 1, 2, 1), (std::vector<int32_t>{8}));
  // No n-gram of at least ngram_min seen before: nothing.
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 3, 4}, 3, 3, 1).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 9, 2}, 3, 3, 2).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{7}, 3, 3, 1).empty());
  // A run of one token proposes more of it.
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{4, 4, 4}, 5, 3, 1), (std::vector<int32_t>{4}));
}

TEST(DraftState, GrowsOnFullAcceptanceShrinksOnRejectionPausesOnMisses) {
  DraftState s;
  for (int i = 0; i < DraftState::kFirstPlainSteps; ++i) EXPECT_EQ(s.wanted(10), 0) << "plain decodes first";
  EXPECT_EQ(s.wanted(10), 4);
  s.verified(4, 4, 10);
  EXPECT_EQ(s.wanted(10), 8);
  s.verified(8, 8, 10);
  EXPECT_EQ(s.wanted(10), 10);
  s.verified(10, 2, 10);
  EXPECT_EQ(s.wanted(10), 3);
  EXPECT_EQ(s.wanted(2), 2);  // never past the cap
  s.verified(3, 0, 10);
  EXPECT_EQ(s.wanted(10), 1);
  s.verified(1, 0, 10);  // the second miss in a row: a pause of 8 steps
  for (int i = 0; i < DraftState::kFirstPause; ++i) EXPECT_EQ(s.wanted(10), 0) << i;
  EXPECT_EQ(s.wanted(10), 1);
  s.verified(1, 0, 10);
  s.verified(1, 0, 10);  // missing again: 16 steps
  for (int i = 0; i < 2 * DraftState::kFirstPause; ++i) EXPECT_EQ(s.wanted(10), 0) << i;
  s.verified(1, 1, 10);  // a hit: the next pause is short again
  EXPECT_EQ(s.next_pause, DraftState::kFirstPause);
  EXPECT_EQ(s.drafted, 4 + 8 + 10 + 3 + 1 + 1 + 1 + 1);
  EXPECT_EQ(s.accepted, 4 + 8 + 2 + 1);
}

TEST(DraftState, PausesWhereItsVerifiesYieldLessThanTheyCost) {
  DraftState s;
  s.paused = 0;
  // A verify costs 2.5 plain steps; each yields 2 tokens (one draft of three accepted).
  for (int i = 0; i < DraftState::kJudgeAfter - 1; ++i) {
    EXPECT_GT(s.wanted(4), 0);
    s.verified(3, 1, 4, 2.5);
    EXPECT_EQ(s.paused, 0) << "judged after " << DraftState::kJudgeAfter << " verifies";
  }
  s.verified(3, 1, 4, 2.5);
  EXPECT_EQ(s.paused, DraftState::kFirstPause);
  // The same yield where a verify costs 1.5 plain steps: drafting goes on.
  DraftState cheap;
  cheap.paused = 0;
  for (int i = 0; i < 10; ++i) cheap.verified(3, 1, 4, 1.5);
  EXPECT_EQ(cheap.paused, 0);
  EXPECT_EQ(cheap.verifies, 10);
}

TEST(SpeculationOptions, BadValuesAreRefusedByName) {
  EXPECT_EQ(parse_draft_kind("ngram"), DraftKind::kNgram);
  EXPECT_EQ(parse_draft_kind("model"), DraftKind::kModel);
  EXPECT_EQ(parse_draft_kind("none"), DraftKind::kNone);
  const auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message([] { parse_draft_kind("eagle"); }).find("--draft-kind 'eagle'"), std::string::npos);
  EXPECT_NE(message([] { parse_draft_kind("head"); }).find("--draft-kind head"), std::string::npos);
  SpeculationOptions o;
  o.kind = DraftKind::kModel;
  EXPECT_NE(message([&] { check_speculation(o); }).find("--draft-model"), std::string::npos);
  o.kind = DraftKind::kNgram;
  o.ngram_min = 4;
  EXPECT_NE(message([&] { check_speculation(o); }).find("--ngram-min 4"), std::string::npos);
  o.ngram_min = 1;
  o.num_draft_tokens = 99;
  EXPECT_NE(message([&] { check_speculation(o); }).find("--num-draft-tokens 99"), std::string::npos);
}

using test_support::TokenSink;

class SpeculationTest : public ::testing::Test {
 protected:
  // A prompt that repeats itself (prompt lookup finds its n-grams) and a plain one.
  static std::vector<std::vector<int32_t>> prompts() {
    std::vector<int32_t> repeated;
    for (int i = 0; i < 3; ++i)
      for (int32_t t : {1, 17, 42, 99, 5, 23, 7, 300}) repeated.push_back(t);
    return {repeated, {1, 17, 42, 99, 5, 23}, {400, 3, 3, 8}};
  }
  static GenerationRequest request(const std::vector<int32_t>& prompt, int64_t max_tokens, float temperature) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = temperature;
    r.sampling.seed = 77;
    r.sampling.seeded = true;
    return r;
  }
  // Every prompt through one engine at once; the tokens of each, and the engine's totals.
  std::vector<std::vector<int32_t>> run(const SpeculationOptions& spec, int batch, float temperature,
                                        SpeculationLoad* totals = nullptr) {
    EngineOptions options;
    options.batch = batch;
    options.speculation = spec;
    EngineCore core(model_, nullptr, {backend_.get()}, options);
    std::vector<std::shared_ptr<TokenSink>> sinks;
    for (const auto& p : prompts()) {
      sinks.push_back(std::make_shared<TokenSink>());
      core.submit(request(p, 40, temperature), sinks.back());
    }
    core.run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (const auto& s : sinks) {
      EXPECT_TRUE(s->end.ok()) << s->end.error;
      EXPECT_EQ(s->end.speculative, spec.on());
      out.push_back(s->tokens);
    }
    if (totals) *totals = core.load().speculation;
    return out;
  }

  Model model_ = load_model(golden_model("llama"));
  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
};

TEST_F(SpeculationTest, EachDrafterGivesTheTokensOfDecodingWithout) {
  SpeculationOptions ngram;
  ngram.kind = DraftKind::kNgram;
  SpeculationOptions model;
  model.kind = DraftKind::kModel;
  model.draft_model = golden_model("qwen2");  // another model with the same 512 ids
  SpeculationOptions itself = model;          // the target as its own draft: every draft right
  itself.draft_model = golden_model("llama");
  for (const float temperature : {0.0f, 0.9f}) {
    const auto plain = run({}, 1, temperature);
    for (const auto& [name, spec] : {std::pair{"ngram", ngram}, std::pair{"model", model}, std::pair{"itself", itself}}) {
      for (const int batch : {1, 3}) {
        SpeculationLoad totals;
        EXPECT_EQ(run(spec, batch, temperature, &totals), plain)
            << name << ", batch " << batch << ", temperature " << temperature;
        EXPECT_GT(totals.verifies, 0) << name;
        EXPECT_EQ(totals.kind, spec.kind == DraftKind::kNgram ? "ngram" : "model");
        if (std::string(name) == "itself" && temperature == 0.0f) {
          EXPECT_EQ(totals.accepted, totals.drafted) << "a greedy draft by the target itself is always right";
          EXPECT_GT(totals.emitted, 2 * totals.verifies) << "several tokens per verify";
        }
      }
    }
  }
}

// A prompt longer than the draft's catch-up chunk (2048) reaches the draft in pieces; the
// target drafting for itself is right every time.
TEST_F(SpeculationTest, ALongPromptReachesTheDraftInChunks) {
  std::vector<int32_t> prompt;
  for (int i = 0; prompt.size() < 2500; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + i / 7) % 500 + 1));
  const GenerationRequest r = request(prompt, 12, 0.0f);
  EngineCore plain(model_, nullptr, {backend_.get()}, EngineOptions{});
  const std::vector<int32_t> expected = generate(plain, r).tokens;
  EngineOptions options;
  options.speculation.kind = DraftKind::kModel;
  options.speculation.draft_model = golden_model("llama");
  EngineCore core(model_, nullptr, {backend_.get()}, options);
  const GenerationResult got = generate(core, r);
  EXPECT_EQ(got.tokens, expected);
  EXPECT_GT(got.end.drafted, 0);
  EXPECT_EQ(got.end.accepted, got.end.drafted);
}

TEST_F(SpeculationTest, ADraftModelOfAnotherVocabularyIsRefused) {
  // A model of the same shape family with another vocabulary: kettle-demo's 4096 ids.
  SpeculationOptions spec;
  spec.kind = DraftKind::kModel;
  spec.draft_model = (fs::path(KETTLE_TEST_DATA) / ".." / ".." / "models" / "kettle-demo-draft").string();
  EngineOptions options;
  options.speculation = spec;
  try {
    EngineCore core(model_, nullptr, {backend_.get()}, options);
    FAIL() << "a draft of another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a vocabulary of 4096 ids, the model's has 512"), std::string::npos) << e.what();
  }
}

// The second token of a 3-token sampled generation is drawn in a verify row (the first comes
// from the prompt's row, and one draft follows it). Over many seeds its frequencies must be
// the target's marginal: Σ over first tokens t of p(t) · p(· | prompt, t), from plain forwards.
TEST_F(SpeculationTest, SampledTokensKeepTheTargetsDistribution) {
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 5, 23};
  const int64_t vocab = model_.spec.vocab_size;
  StandaloneRunner reference = make_standalone_runner(model_, {backend_.get()});
  const auto softmax = [](std::vector<float> logits) {
    const float top = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    std::vector<double> p(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(static_cast<double>(logits[i]) - top);
    for (double& x : p) x /= sum;
    return p;
  };
  std::vector<float> logits(static_cast<size_t>(vocab));
  {
    KvCache kv = reference->new_cache();
    reference->forward(prompt.data(), static_cast<int64_t>(prompt.size()), kv, LogitsFor::kLastToken, logits.data());
  }
  const std::vector<double> first = softmax(logits);
  std::vector<double> second(static_cast<size_t>(vocab), 0.0);
  for (int32_t t = 0; t < vocab; ++t) {
    std::vector<int32_t> context = prompt;
    context.push_back(t);
    KvCache kv = reference->new_cache();
    reference->forward(context.data(), static_cast<int64_t>(context.size()), kv, LogitsFor::kLastToken, logits.data());
    const std::vector<double> next = softmax(logits);
    for (int64_t v = 0; v < vocab; ++v) second[static_cast<size_t>(v)] += first[static_cast<size_t>(t)] * next[static_cast<size_t>(v)];
  }

  EngineOptions options;
  options.batch = 64;
  options.speculation.kind = DraftKind::kModel;
  options.speculation.draft_model = golden_model("llama");
  EngineCore core(model_, nullptr, {backend_.get()}, options);
  constexpr int kSeeds = 6000;
  std::vector<std::shared_ptr<TokenSink>> sinks;
  for (int s = 0; s < kSeeds; ++s) {
    GenerationRequest r = request(prompt, 3, 1.0f);
    r.sampling.seed = static_cast<uint64_t>(s) * 7919 + 1;
    sinks.push_back(std::make_shared<TokenSink>());
    core.submit(std::move(r), sinks.back());
  }
  while (!core.idle()) {
    for (const auto& seq : core.scheduler().running_sequences())
      if (seq->speculation.verifies == 0) seq->speculation.paused = 0;  // no plain decodes first: draft at once
    core.step();
  }
  EXPECT_GE(core.load().speculation.verifies, kSeeds) << "every second token came from a verify row";
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (const auto& s : sinks) {
    ASSERT_EQ(s->tokens.size(), 3u);
    ++counts[static_cast<size_t>(s->tokens[1])];
  }
  // Pearson's chi-square over the bins expecting ≥ 5, the rest pooled; the critical value at
  // p = 0.001 by Wilson–Hilferty.
  double chi2 = 0.0, pooled_expected = 0.0, pooled_seen = 0.0;
  int bins = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double expected = kSeeds * second[static_cast<size_t>(v)];
    const auto seen = static_cast<double>(counts[static_cast<size_t>(v)]);
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_seen += seen;
      continue;
    }
    chi2 += (seen - expected) * (seen - expected) / expected;
    ++bins;
  }
  if (pooled_expected > 0.0) {
    chi2 += (pooled_seen - pooled_expected) * (pooled_seen - pooled_expected) / pooled_expected;
    ++bins;
  }
  const double df = bins - 1, z = 3.090;  // the normal's 0.999 quantile
  const double critical = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
  ASSERT_GE(bins, 20);
  EXPECT_LT(chi2, critical) << bins << " bins";
}

}  // namespace
}  // namespace kettle
