// SampleRow's rule on the host: scale by 1/temperature, keep the top_k largest
// (all when off; ties to the lower id), softmax over them, cut to the smallest
// prefix whose mass reaches top_p, drop tokens under min_p × the top
// probability, then walk the kept tokens until the running mass passes
// uniform × their total.
#include "backend/cpu/sample_row.h"

#include <algorithm>
#include <cmath>

namespace kettle::cpu {
namespace {

int32_t first_max(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

}  // namespace

int32_t sample_row(const float* logits, int64_t vocab, const SampleRow& row, double uniform,
                   std::vector<std::pair<float, int32_t>>& candidates) {
  if (row.temperature <= 0.0f) return first_max(logits, vocab);
  candidates.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    candidates[static_cast<size_t>(i)] = {logits[i] / row.temperature, static_cast<int32_t>(i)};
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates.size();
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < keep) {
    keep = static_cast<size_t>(row.top_k);
    std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(keep), candidates.end(), by_logit);
  } else {
    std::sort(candidates.begin(), candidates.end(), by_logit);
  }
  const double top = candidates[0].first;
  const auto weight = [&](size_t i) { return std::exp(static_cast<double>(candidates[i].first) - top); };
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += weight(i);
  if (row.top_p < 1.0f) {  // the smallest prefix whose probability reaches top_p (at least one token)
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += weight(i) / sum;
      if (mass >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (row.min_p > 0.0f) {  // the top token's probability is 1 / sum
    const double floor = row.min_p / sum;
    size_t cut = 1;
    while (cut < keep && weight(cut) / sum >= floor) ++cut;
    keep = cut;
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += weight(i);
  double r = uniform * kept;
  for (size_t i = 0; i < keep; ++i) {
    r -= weight(i);
    if (r < 0.0) return candidates[i].second;
  }
  return candidates[keep - 1].second;
}

}  // namespace kettle::cpu
