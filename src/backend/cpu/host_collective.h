// HostGroup: the ranks of a tensor-parallel model on host backends, one thread
// per rank in one process. Each rank's HostCollective posts its buffer, waits
// for the others at a barrier and reads theirs; sums run over the ranks in rank
// order, so every rank gets the same bits. The CPU test of the split logic
// (tests/golden/tensor_parallel_test.cpp) runs on it.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "backend/collective.h"

namespace kettle {

class HostGroup {
 public:
  explicit HostGroup(int ranks);
  // Rank `rank`'s view of the group; the group must outlive it.
  std::unique_ptr<Collective> member(int rank);

 private:
  friend class HostCollective;
  struct Part {
    const float* data = nullptr;
    int64_t cols = 0, begin = 0;
  };
  int ranks_;
  std::barrier<> barrier_;
  std::vector<Part> posted_;  // one per rank
};

}  // namespace kettle
