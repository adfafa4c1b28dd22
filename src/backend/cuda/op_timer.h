// OpTimer: where a CUDA step's time goes, op by op, for kernel work.
// With KETTLE_CUDA_PROFILE=1 in the environment the backend runs every step
// eagerly (no graphs) and records an event after each op; an op's time is the
// gap between its event and the one before. After a host sync the chain starts
// again, so the first op after a sync also carries the host's time before it.
// report() writes the table (op, calls, total ms, share) to stderr.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace kettle::cuda {

class OpTimer {
 public:
  OpTimer();
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  bool enabled() const { return enabled_; }
  void bind(cudaStream_t stream) { stream_ = stream; }
  // After an op was launched on the stream.
  void mark(const std::string& op);
  // After the host waited for the stream: the next op is timed from here.
  void restart();
  // Waits for the stream and writes the totals so far (nothing when disabled).
  void report();

 private:
  struct Total {
    long calls = 0;
    double ms = 0.0;
  };
  void harvest();
  cudaEvent_t next_event();

  bool enabled_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> ops_;  // ops_[i] ended at events_[i + 1]; empty: a restart
  size_t used_ = 0;
  std::map<std::string, Total> totals_;
};

}  // namespace kettle::cuda
