// Sampler: greedy, the warpers' support, and the distribution of draws
// against the softmax computed here in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace kettle {
namespace {

TEST(Sampler, GreedyTakesFirstMaximum) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
}

std::map<int, int> draw(const std::vector<float>& logits, SamplingParams p, int n) {
  Sampler s(p);
  std::map<int, int> counts;
  for (int i = 0; i < n; ++i) counts[s.sample(logits.data(), static_cast<int64_t>(logits.size()))]++;
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
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 100), b.sample(logits.data(), 100));
}

}  // namespace
}  // namespace kettle
