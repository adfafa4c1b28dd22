// Seeded Gaussian test inputs, for tests that check an op against a reference of their own.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kettle::test {

inline std::vector<float> gaussian_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace kettle::test
