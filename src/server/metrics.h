// Metrics: what the server has done since it started — requests by route and
// outcome, tokens in and out, time to first token and decode speed — read by
// GET /stats (JSON) and GET /metrics (Prometheus text format 0.0.4).
// Thread-safe; every handler thread records into the one instance.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "engine/engine_load.h"

namespace kettle::server {

using kettle::EngineLoad;

class Metrics {
 public:
  Metrics();

  // One finished HTTP request of a generation route (status 200 or the error's).
  void record_request(const std::string& route, int status);
  // One finished generation.
  void record_generation(int64_t prompt_tokens, int64_t completion_tokens, double prefill_seconds,
                         double decode_seconds, double time_to_first_token_seconds);

  nlohmann::json stats(const EngineLoad& load, const std::string& model_id) const;
  std::string prometheus(const EngineLoad& load, const std::string& model_id) const;

 private:
  static constexpr std::array<double, 10> kTtftBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point started_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status) → count
  int64_t generations_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  double prefill_seconds_ = 0.0;
  double decode_seconds_ = 0.0;
  double ttft_sum_ = 0.0;
  std::array<int64_t, kTtftBuckets.size()> ttft_counts_{};  // cumulative counts per bucket bound
  double last_decode_tokens_per_second_ = 0.0;
};

}  // namespace kettle::server
