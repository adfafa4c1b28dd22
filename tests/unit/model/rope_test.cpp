// RoPE inverse frequencies against transformers' formulas evaluated
// independently here in double precision.
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope_config.h"

namespace kettle {
namespace {

std::vector<double> reference_default(double theta, int dim) {
  std::vector<double> inv;
  for (int i = 0; i < dim; i += 2) inv.push_back(1.0 / std::pow(theta, static_cast<double>(i) / dim));
  return inv;
}

TEST(Rope, DefaultAndLinear) {
  RopeSpec r;
  r.theta = 10000.0;
  RopeTable t = compute_rope_table(r, 64, 4096, 0);
  auto ref = reference_default(10000.0, 64);
  ASSERT_EQ(t.inv_freq.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t.inv_freq[i], ref[i], 1e-6 * ref[i]);
  r.type = RopeType::kLinear;
  r.factor = 4.0;
  t = compute_rope_table(r, 64, 4096, 0);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t.inv_freq[i], ref[i] / 4.0, 1e-6 * ref[i]);
}

TEST(Rope, Llama3MatchesReferenceFormula) {
  RopeSpec r;
  r.type = RopeType::kLlama3;
  r.theta = 500000.0;
  r.factor = 32.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position = 8192;
  RopeTable t = compute_rope_table(r, 64, 131072, 0);
  auto base = reference_default(500000.0, 64);
  const double low_wl = 8192 / 1.0, high_wl = 8192 / 4.0;
  for (size_t i = 0; i < base.size(); ++i) {
    double wl = 2 * M_PI / base[i];
    double expected = base[i];
    if (wl > low_wl) expected = base[i] / 32.0;
    else if (wl >= high_wl) {
      double smooth = (8192 / wl - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * base[i] / 32.0 + smooth * base[i];
    }
    EXPECT_NEAR(t.inv_freq[i], expected, 2e-6 * expected) << i;
  }
}

TEST(Rope, PartialRotaryDim) {
  RopeSpec r;
  r.partial_rotary_factor = 0.25;
  RopeTable t = compute_rope_table(r, 128, 4096, 0);
  EXPECT_EQ(t.rotary_dim, 32);
  EXPECT_EQ(t.inv_freq.size(), 16u);
}

TEST(Rope, LongRopeSwitchesPastOriginalContext) {
  RopeSpec r;
  r.type = RopeType::kLongRope;
  r.original_max_position = 4096;
  r.short_factor = std::vector<double>(8, 1.0);
  r.long_factor = std::vector<double>(8, 4.0);
  RopeTable short_t = compute_rope_table(r, 16, 131072, 100);
  RopeTable long_t = compute_rope_table(r, 16, 131072, 5000);
  EXPECT_NEAR(long_t.inv_freq[3], short_t.inv_freq[3] / 4.0, 1e-9);
  double expected_attention = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
  EXPECT_NEAR(short_t.attention_factor, expected_attention, 1e-6);
}

TEST(Rope, YarnAttentionFactor) {
  RopeSpec r;
  r.type = RopeType::kYarn;
  r.factor = 4.0;
  r.original_max_position = 32768;
  RopeTable t = compute_rope_table(r, 128, 131072, 0);
  EXPECT_NEAR(t.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);
  auto base = reference_default(10000.0, 128);
  EXPECT_NEAR(t.inv_freq[0], base[0], 1e-6);                      // high frequency: extrapolated
  EXPECT_NEAR(t.inv_freq[63], base[63] / 4.0, 1e-6 * base[63]);   // low frequency: interpolated
}

}  // namespace
}  // namespace kettle
