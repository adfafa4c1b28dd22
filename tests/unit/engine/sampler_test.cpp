// Sampler: greedy, the warpers' support, and the distribution of draws
// against the softmax computed here in double precision; penalties, bias and
// logprobs against double re-implementations of the HF / OpenAI formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "util/error.h"

#include "backend/backend.h"
#include "engine/sampler.h"

namespace kettle {
namespace {

TEST(Sampler, GreedyTakesFirstMaximum) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits.data(), 4).id, 1);
}

std::map<int, int> draw(const std::vector<float>& logits, SamplingParams p, int n) {
  Sampler s(p);
  std::map<int, int> counts;
  for (int i = 0; i < n; ++i) counts[s.sample(logits.data(), static_cast<int64_t>(logits.size())).id]++;
  return counts;
}

TEST(Sampler, FrequenciesFollowTemperedSoftmax) {
  std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  const int n = 200000;
  auto counts = draw(logits, p, n);
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (int i = 0; i < 4; ++i) {
    double expected = std::exp(logits[static_cast<size_t>(i)] / 0.7) / z;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expected, 0.005) << i;
  }
}

TEST(Sampler, TopKTopPMinPRestrictSupport) {
  std::vector<float> logits = {4.0f, 3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  p.top_k = 2;
  auto counts = draw(logits, p, 5000);
  EXPECT_EQ(counts.size(), 2u);
  p.top_k = 0;
  p.top_p = 0.7f;  // softmax ≈ .64 .24 .09 ...: two tokens reach 0.7
  counts = draw(logits, p, 5000);
  EXPECT_EQ(counts.size(), 2u);
  p.top_p = 1.0f;
  p.min_p = 0.3f;  // keeps tokens with p >= 0.3 × 0.64: the first two
  counts = draw(logits, p, 5000);
  EXPECT_EQ(counts.size(), 2u);
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[static_cast<size_t>(i)] = std::sin(i * 1.3f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 100).id, b.sample(logits.data(), 100).id);
}

// ---- penalties, logit_bias, logprobs ------------------------------------------

std::vector<float> random_logits(std::mt19937& rng, int vocab) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& x : l) x = d(rng);
  l[0] = 0.0f;  // exactly zero: neither divided nor multiplied in effect
  return l;
}

std::vector<int32_t> random_ids(std::mt19937& rng, int vocab, int n) {
  // A small range so ids repeat.
  std::uniform_int_distribution<int32_t> d(0, std::min(vocab - 1, 12));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

// transformers RepetitionPenaltyLogitsProcessor, then OpenAI presence/frequency
// (generated tokens only), then logit_bias — in double.
std::vector<double> reference_processed(const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                                        const std::vector<int32_t>& generated, const SamplingParams& p) {
  std::vector<double> l(logits.begin(), logits.end());
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(generated.begin(), generated.end());
  for (int32_t id : seen) {
    double& x = l[static_cast<size_t>(id)];
    x = x < 0 ? x * p.repetition_penalty : x / p.repetition_penalty;
  }
  std::map<int32_t, int> count;
  for (int32_t id : generated) count[id]++;
  for (auto [id, c] : count) l[static_cast<size_t>(id)] -= p.presence_penalty * (c > 0) + p.frequency_penalty * c;
  for (auto [id, b] : p.logit_bias) l[static_cast<size_t>(id)] += b;
  return l;
}

const float* processed(Sampler& s, const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated) {
  s.start(prompt, static_cast<int64_t>(logits.size()), 16);
  for (int32_t id : generated) s.accept(id);
  return s.processed_logits(logits.data(), static_cast<int64_t>(logits.size()));
}

void expect_near_all(const float* got, const std::vector<double>& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::abs(want[i]))) << what << " token " << i;
}

TEST(SamplerPenalties, RepetitionPenaltyMatchesTransformers) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(rng, 40);
    auto prompt = random_ids(rng, 40, 10), generated = random_ids(rng, 40, 6);
    SamplingParams p;
    p.repetition_penalty = trial % 2 ? 1.3f : 0.7f;  // below 1 rewards repeats
    Sampler s(p);
    expect_near_all(processed(s, logits, prompt, generated), reference_processed(logits, prompt, generated, p),
                    "trial " + std::to_string(trial));
  }
}

TEST(SamplerPenalties, PresenceAndFrequencyCountGeneratedTokensOnly) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(rng, 40);
    auto prompt = random_ids(rng, 40, 10), generated = random_ids(rng, 40, 9);
    SamplingParams p;
    p.presence_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    p.frequency_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    Sampler s(p);
    expect_near_all(processed(s, logits, prompt, generated), reference_processed(logits, prompt, generated, p),
                    "trial " + std::to_string(trial));
  }
}

TEST(SamplerPenalties, AllTogetherWithBias) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = random_logits(rng, 30);
    auto prompt = random_ids(rng, 30, 8), generated = random_ids(rng, 30, 8);
    SamplingParams p;
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = -0.25f;
    p.logit_bias = {{3, 2.5f}, {7, -1.0f}, {3, 0.5f}};  // a repeated id adds up
    Sampler s(p);
    expect_near_all(processed(s, logits, prompt, generated), reference_processed(logits, prompt, generated, p),
                    "trial " + std::to_string(trial));
  }
}

TEST(SamplerPenalties, SampleRecordsItsOwnTokens) {
  // Greedy with a frequency penalty must walk away from a token once it repeats.
  std::vector<float> logits = {1.0f, 1.5f, 0.2f};
  SamplingParams p;
  p.frequency_penalty = 0.4f;
  Sampler s(p);
  s.start({}, 3, 8);
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(s.sample(logits.data(), 3).id);
  // 1.5 → 1.1 → 0.7 for token 1; token 0 takes over at the third step, then they alternate.
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 0, 1}));
}

TEST(SamplerPenalties, GreedyHonoursRepetitionPenaltyOnThePrompt) {
  std::vector<float> logits = {2.0f, 1.9f, -1.0f};
  SamplingParams p;
  p.repetition_penalty = 1.2f;  // 2.0 / 1.2 < 1.9
  Sampler s(p);
  s.start(std::vector<int32_t>{0}, 3, 4);
  EXPECT_EQ(s.sample(logits.data(), 3).id, 1);
}

TEST(SamplerLogitBias, BansAndForces) {
  std::mt19937 rng(4);
  auto logits = random_logits(rng, 50);
  int32_t best = argmax(logits.data(), 50);
  SamplingParams ban;
  ban.logit_bias = {{best, -100.0f}};
  Sampler greedy_ban(ban);
  EXPECT_NE(greedy_ban.sample(logits.data(), 50).id, best);
  ban.temperature = 1.0f;
  ban.seed = 5;
  Sampler sampled_ban(ban);
  for (int i = 0; i < 2000; ++i) ASSERT_NE(sampled_ban.sample(logits.data(), 50).id, best);

  SamplingParams force;
  force.logit_bias = {{17, 100.0f}};
  force.temperature = 1.5f;
  force.seed = 6;
  Sampler forced(force);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(forced.sample(logits.data(), 50).id, 17);
  force.temperature = 0.0f;
  Sampler greedy_forced(force);
  EXPECT_EQ(greedy_forced.sample(logits.data(), 50).id, 17);
}

TEST(SamplerLogitBias, ValidationNamesTheBadField) {
  SamplingParams p;
  p.logit_bias = {{50, 1.0f}};
  EXPECT_THROW(validate_sampling(p, 50), Error);
  p.logit_bias = {{49, 1.0f}};
  EXPECT_NO_THROW(validate_sampling(p, 50));
  p.presence_penalty = 2.5f;
  EXPECT_THROW(validate_sampling(p, 50), Error);
  p.presence_penalty = 0.0f;
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(validate_sampling(p, 50), Error);
  p.repetition_penalty = 1.0f;
  p.top_logprobs = 21;
  EXPECT_THROW(validate_sampling(p, 50), Error);
}

std::vector<double> log_softmax(const std::vector<double>& l) {
  double m = *std::max_element(l.begin(), l.end()), z = 0.0;
  for (double x : l) z += std::exp(x - m);
  std::vector<double> out;
  for (double x : l) out.push_back(x - m - std::log(z));
  return out;
}

TEST(SamplerLogprobs, EqualDoubleLogSoftmaxOfProcessedLogits) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 30; ++trial) {
    auto logits = random_logits(rng, 64);
    auto prompt = random_ids(rng, 64, 6);
    SamplingParams p;
    p.temperature = trial % 3 == 0 ? 0.0f : 0.6f;  // the temperature must not change the logprobs
    p.top_k = 5;
    p.seed = static_cast<uint64_t>(trial);
    p.repetition_penalty = 1.1f;
    p.logit_bias = {{5, 1.5f}};
    p.logprobs = true;
    p.top_logprobs = 20;
    Sampler s(p);
    s.start(prompt, 64, 4);
    SampledToken t = s.sample(logits.data(), 64);
    auto want = log_softmax(reference_processed(logits, prompt, {}, p));
    EXPECT_NEAR(t.logprob, want[static_cast<size_t>(t.id)], 1e-5);
    std::vector<int32_t> order(64);
    for (int32_t i = 0; i < 64; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return want[a] > want[b]; });
    ASSERT_EQ(t.top.size(), 20u);
    for (size_t i = 0; i < 20; ++i) {
      EXPECT_EQ(t.top[i].id, order[i]) << i;
      EXPECT_NEAR(t.top[i].logprob, want[static_cast<size_t>(order[i])], 1e-5) << i;
    }
  }
}

TEST(SamplerLogprobs, TopTiesGoToTheLowerIdAndNIsCapped) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 2.0f};
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = 4;
  Sampler s(p);
  SampledToken t = s.sample(logits.data(), 6);
  EXPECT_EQ(t.id, 1);
  std::vector<int32_t> ids;
  for (const auto& e : t.top) ids.push_back(e.id);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 2, 4}));
  EXPECT_FLOAT_EQ(t.top[0].logprob, t.top[1].logprob);
  EXPECT_FLOAT_EQ(t.logprob, t.top[0].logprob);

  p.top_logprobs = 20;  // more than the vocabulary: all of it
  Sampler all(p);
  EXPECT_EQ(all.sample(logits.data(), 6).top.size(), 6u);
  p.top_logprobs = 0;  // only the chosen token's logprob
  Sampler none(p);
  SampledToken only = none.sample(logits.data(), 6);
  EXPECT_TRUE(only.top.empty());
  EXPECT_LT(only.logprob, 0.0f);
}

TEST(SamplerLogprobs, NotComputedUnlessAsked) {
  std::vector<float> logits = {0.5f, 0.1f};
  Sampler s(SamplingParams{});
  SampledToken t = s.sample(logits.data(), 2);
  EXPECT_EQ(t.logprob, 0.0f);
  EXPECT_TRUE(t.top.empty());
}

TEST(SamplerExtras, OffLeavesGreedyAndSamplingUnchanged) {
  std::mt19937 rng(12);
  auto logits = random_logits(rng, 200);
  SamplingParams p;
  Sampler plain(p);
  plain.start(random_ids(rng, 200, 30), 200, 8);
  EXPECT_EQ(plain.processed_logits(logits.data(), 200), logits.data());  // no copy at all
  EXPECT_EQ(plain.sample(logits.data(), 200).id, argmax(logits.data(), 200));
  // Sampled runs draw the same sequence with and without a history (and with logprobs on).
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = 77;
  Sampler a(p);
  p.logprobs = true;
  p.top_logprobs = 3;
  Sampler b(p);
  b.start(random_ids(rng, 200, 30), 200, 8);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(logits.data(), 200).id, b.sample(logits.data(), 200).id);
}

TEST(SamplerExtras, SameSeedSameDrawsWithPenalties) {
  std::mt19937 rng(13);
  auto logits = random_logits(rng, 100);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = 0.3f;
  Sampler a(p), b(p);
  std::vector<int32_t> prompt = {1, 2, 3};
  a.start(prompt, 100, 50);
  b.start(prompt, 100, 50);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(a.sample(logits.data(), 100).id, b.sample(logits.data(), 100).id);
}

}  // namespace
}  // namespace kettle

namespace kettle {
namespace {

// A request's draws are the same whether the host Sampler draws them or a backend's
// `sample` op does from device_row(): the same uniforms from the same seeded generator,
// the same rule (cpu::sample_row). The CPU backend's op stands in for the device here;
// tests/unit/backend/cuda_ops_test.cpp holds the CUDA op to the CPU one.
TEST(SamplerOnDevice, DeviceRowsDrawWhatTheHostSamplerDraws) {
  auto backend = make_cpu_backend(1);
  std::mt19937 gen(5);
  std::normal_distribution<float> d(0.0f, 2.0f);
  const int64_t vocab = 500;
  for (const auto& [temp, top_k, top_p, min_p] :
       std::vector<std::tuple<float, int, float, float>>{{0.0f, 0, 1.0f, 0.0f}, {0.8f, 0, 1.0f, 0.0f},
                                                         {1.2f, 40, 0.9f, 0.0f}, {0.7f, 0, 1.0f, 0.1f}}) {
    SamplingParams p;
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = 77;
    Sampler host(p), device(p);
    ASSERT_TRUE(device.on_device());
    for (int step = 0; step < 50; ++step) {
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (auto& x : logits) x = d(gen);
      const int32_t expected = host.sample(logits.data(), vocab).id;
      const SampleRow row = device.device_row();
      int32_t id = -1;
      backend->sample(logits.data(), 1, vocab, &row, &id);
      device.accept(id);
      ASSERT_EQ(id, expected) << "temperature " << temp << " step " << step;
    }
  }
}

TEST(SamplerOnDevice, PenaltiesBiasAndLogprobsKeepTheLogitsOnTheHost) {
  SamplingParams p;
  EXPECT_TRUE(Sampler(p).on_device());
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(Sampler(p).on_device());
  p = SamplingParams{};
  p.logit_bias = {{3, 1.0f}};
  EXPECT_FALSE(Sampler(p).on_device());
  p = SamplingParams{};
  p.logprobs = true;
  EXPECT_FALSE(Sampler(p).on_device());
}

}  // namespace
}  // namespace kettle

namespace kettle {
namespace {

// Penalty windows (repetition / presence / frequency *_context_size) against a direct
// count over the last N tokens, at every step of a run with repeats, for several windows.
TEST(Sampler, PenaltyWindowsCountOnlyTheLastTokens) {
  const int64_t vocab = 50;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(0, 11);  // few ids: many repeats, ids leave and return
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<int32_t> prompt(30);
  for (auto& t : prompt) t = id(rng);
  for (const auto& [rep, pres, freq] : {std::tuple<int64_t, int64_t, int64_t>{0, 0, 0}, {8, 5, 5}, {3, 7, 2}, {40, 0, 6}}) {
    SamplingParams p;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repetition_context_size = rep;
    p.presence_context_size = pres;
    p.frequency_context_size = freq;
    Sampler s(p);
    s.start(prompt, vocab, 64);
    std::vector<int32_t> all = prompt, output;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (auto& l : logits) l = value(rng);
      const auto last = [](const std::vector<int32_t>& ids, int64_t n) {
        const size_t from = n > 0 && ids.size() > static_cast<size_t>(n) ? ids.size() - static_cast<size_t>(n) : 0;
        return std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
      };
      std::vector<float> expected = logits;
      std::set<int32_t> seen;
      for (int32_t t : last(all, rep)) seen.insert(t);
      for (int32_t t : seen) expected[t] = expected[t] > 0 ? expected[t] / 1.3f : expected[t] * 1.3f;
      std::map<int32_t, int> freq_count, pres_count;
      for (int32_t t : last(output, freq)) ++freq_count[t];
      for (int32_t t : last(output, pres)) ++pres_count[t];
      for (int64_t t = 0; t < vocab; ++t) {
        const auto i = static_cast<int32_t>(t);
        if (freq_count.count(i)) expected[t] -= 0.25f * static_cast<float>(freq_count[i]);
        if (pres_count.count(i)) expected[t] -= 0.5f;
      }
      const float* got = s.processed_logits(logits.data(), vocab);
      for (int64_t t = 0; t < vocab; ++t)
        ASSERT_EQ(got[t], expected[t]) << "windows " << rep << "/" << pres << "/" << freq << " step " << step
                                             << " token " << t;
      const int32_t next = id(rng);
      s.accept(next);
      all.push_back(next);
      output.push_back(next);
    }
  }
  SamplingParams bad;
  bad.presence_context_size = -1;
  EXPECT_THROW(validate_sampling(bad, vocab), Error);
}

}  // namespace
}  // namespace kettle

namespace kettle {
namespace {

// XTC: with probability 1, of the tokens at or above the threshold all but the least
// likely go; below two such tokens nothing changes; the chance is per token; the
// reported logprobs stay those of the unfiltered distribution.
TEST(Sampler, XtcRemovesTheTopChoicesButTheLeastLikelyOfThem) {
  // softmax of {3, 2.5, 2, 0, ...}: tokens 0, 1 and 2 are above 0.1; token 2 is the least of them.
  std::vector<float> logits(20, 0.0f);
  logits[0] = 3.0f, logits[1] = 2.5f, logits[2] = 2.0f;
  SamplingParams p;
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.1f;
  p.logprobs = true;
  Sampler greedy(p);
  greedy.start({}, 20);
  const SampledToken t = greedy.sample(logits.data(), 20);
  EXPECT_EQ(t.id, 2);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);  // the unfiltered distribution's
  EXPECT_FALSE(greedy.on_device());
  // A threshold only the top token reaches: no change.
  p.xtc_threshold = 0.4f;
  Sampler high(p);
  high.start({}, 20);
  EXPECT_EQ(high.sample(logits.data(), 20).id, 0);
  // Sampling at temperature 1: never one of the removed tokens.
  p.xtc_threshold = 0.1f;
  p.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p);
    s.start({}, 20);
    const int32_t id = s.sample(logits.data(), 20).id;
    EXPECT_NE(id, 0);
    EXPECT_NE(id, 1);
  }
  // The chance applies per token: about half of 2,000 greedy picks lose the top choices.
  p.temperature = 0.0f;
  p.xtc_probability = 0.5f;
  int removed = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    p.seed = seed;
    Sampler s(p);
    s.start({}, 20);
    removed += s.sample(logits.data(), 20).id == 2;
  }
  EXPECT_NEAR(removed, 1000, 4 * std::sqrt(2000 * 0.25));  // four standard deviations
  SamplingParams bad;
  bad.xtc_probability = 1.5f;
  EXPECT_THROW(validate_sampling(bad, 20), Error);
}

}  // namespace
}  // namespace kettle
