// What bench's tests share: mean ± sd, the synthetic prompt ids, and a sink that
// timestamps every token (cmd_bench.cpp, bench_speculation.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "engine/request.h"
#include "util/error.h"
#include "util/timer.h"

namespace kettle::cli {

struct Stat {
  double mean = 0, sd = 0;
};

inline Stat stat_of(const std::vector<double>& v) {
  Stat s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0.0;
  return s;
}

inline std::vector<int32_t> bench_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  return ids;
}

// When each token of a generation came (seconds on `clock`); a failed generation fails the bench.
class TimingSink final : public GenerationSink {
 public:
  explicit TimingSink(const Timer& clock) : clock_(clock) {}
  void on_output(GenerationOutput output) override {
    for (size_t i = 0; i < output.ids.size(); ++i) times.push_back(clock_.seconds());
  }
  void on_end(const GenerationEnd& end) override {
    if (!end.ok()) fail(end.error_category, "bench: a generation failed: {}", end.error);
  }
  std::vector<double> times;

 private:
  const Timer& clock_;
};

}  // namespace kettle::cli
