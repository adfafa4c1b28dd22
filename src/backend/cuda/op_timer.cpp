#include "backend/cuda/op_timer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kettle::cuda {

namespace {
constexpr size_t kEventsPerHarvest = 4096;
}

OpTimer::OpTimer() {
  const char* flag = std::getenv("KETTLE_CUDA_PROFILE");
  enabled_ = flag != nullptr && std::strcmp(flag, "1") == 0;
}

OpTimer::~OpTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void OpTimer::report() {
  if (!enabled_) return;
  harvest();
  double all = 0.0;
  for (const auto& [op, t] : totals_) all += t.ms;
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::fprintf(stderr, "kettle cuda profile: %-24s %10s %12s %12s %7s\n", "op", "calls", "total ms", "us/call", "share");
  for (const auto& [op, t] : rows)
    std::fprintf(stderr, "kettle cuda profile: %-24s %10ld %12.3f %12.2f %6.1f%%\n", op.c_str(), t.calls, t.ms,
                 1e3 * t.ms / static_cast<double>(t.calls), all > 0 ? 100.0 * t.ms / all : 0.0);
}

cudaEvent_t OpTimer::next_event() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    events_.push_back(e);
  }
  return events_[used_++];
}

void OpTimer::restart() {
  if (!enabled_) return;
  if (used_ + 1 >= kEventsPerHarvest) harvest();
  if (used_ > 0) ops_.emplace_back();
  cudaEventRecord(next_event(), stream_);
}

void OpTimer::mark(const std::string& op) {
  if (!enabled_) return;
  if (used_ + 1 >= kEventsPerHarvest) harvest();
  if (used_ == 0) {  // no start yet: this op is not timed, but the next one is
    cudaEventRecord(next_event(), stream_);
    return;
  }
  ops_.push_back(op);
  cudaEventRecord(next_event(), stream_);
}

// Sums the recorded gaps into totals_ and starts a new chain at the last event.
void OpTimer::harvest() {
  if (used_ < 2) return;
  cudaEventSynchronize(events_[used_ - 1]);
  for (size_t i = 0; i + 1 < used_; ++i) {
    if (ops_[i].empty()) continue;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, events_[i], events_[i + 1]);
    Total& t = totals_[ops_[i]];
    ++t.calls;
    t.ms += ms;
  }
  std::swap(events_[0], events_[used_ - 1]);
  used_ = 1;
  ops_.clear();
}

}  // namespace kettle::cuda
