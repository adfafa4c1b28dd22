// Sampler: next token from a row of logits. Greedy when temperature is 0;
// otherwise temperature → top-k → top-p → min-p, in transformers' order,
// drawn from a generator seeded per request so a seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kettle {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// argmax with the lowest index winning ties, as torch.argmax does.
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace kettle
