// One row of temperature / top-k / top-p / min-p sampling (SampleRow), the
// reference both the CPU backend's `sample` op and the host Sampler run, so a
// seeded request draws the same token wherever its logits live.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace kettle::cpu {

// The token SampleRow's rule picks from logits[0, vocab) with `uniform` in [0, 1);
// `candidates` is scratch (kept between calls so decoding allocates once).
int32_t sample_row(const float* logits, int64_t vocab, const SampleRow& row, double uniform,
                   std::vector<std::pair<float, int32_t>>& candidates);
inline int32_t sample_row(const float* logits, int64_t vocab, const SampleRow& row,
                          std::vector<std::pair<float, int32_t>>& candidates) {
  return sample_row(logits, vocab, row, row.uniform, candidates);
}

}  // namespace kettle::cpu
