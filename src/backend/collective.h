// Collective: what the ranks of a tensor-parallel model exchange (issue 8).
// One object per rank; every rank calls the same operations in the same order
// (the ranks run in lockstep). Buffers are in the rank's backend memory.
// Host ranks use HostCollective (cpu/host_collective.h); GPU ranks will use NCCL.
#pragma once

#include <cstdint>

namespace kettle {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // x[count] = the sum over ranks of x[count], with the same bits on every rank.
  virtual void all_reduce_sum(float* x, int64_t count) = 0;
  // Rank r holds columns [begin_r, begin_r + cols_r) of a [rows, width] matrix as
  // part [rows, cols_r]; every rank receives the whole matrix (row stride width).
  virtual void all_gather_columns(const float* part, int64_t rows, int64_t cols, int64_t begin, float* whole,
                                  int64_t width) = 0;
};

}  // namespace kettle
