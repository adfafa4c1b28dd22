// HostGroup: the ranks of a tensor-parallel model on host backends, one thread
// per rank in one process. Each rank's HostCollective posts its buffer, waits
// for the others at a barrier and reads theirs; sums run over the ranks in rank
// order, so every rank gets the same bits. The CPU test of the split logic
// (tests/golden/tensor_parallel_test.cpp) runs on it. A rank that fails calls
// abort(): the others, waiting or about to wait, throw instead of hanging; reset()
// makes the group usable again once every rank has stopped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/collective.h"

namespace kettle {

class HostGroup {
 public:
  explicit HostGroup(int ranks);
  // Rank `rank`'s view of the group; the group must outlive it.
  std::unique_ptr<Collective> member(int rank);
  void abort();
  void reset();

 private:
  friend class HostCollective;
  // Every rank waits until all have arrived; throws kettle::Error once aborted.
  void arrive_and_wait();
  struct Part {
    const float* data = nullptr;
    int64_t cols = 0, begin = 0;
  };
  int ranks_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Part> posted_;  // one per rank
};

}  // namespace kettle
