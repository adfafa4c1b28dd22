#include "backend/cpu/host_collective.h"

#include <algorithm>

#include "util/error.h"

namespace kettle {

class HostCollective final : public Collective {
 public:
  HostCollective(HostGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int ranks() const override { return group_.ranks_; }

  void all_reduce_sum(float* x, int64_t count) override {
    group_.posted_[static_cast<size_t>(rank_)] = {x, count, 0};
    group_.arrive_and_wait();
    sum_.assign(static_cast<size_t>(count), 0.0f);
    for (const HostGroup::Part& part : group_.posted_)
      for (int64_t i = 0; i < count; ++i) sum_[static_cast<size_t>(i)] += part.data[i];
    group_.arrive_and_wait();  // every rank has read every x
    std::copy(sum_.begin(), sum_.end(), x);
  }

  void all_gather_columns(const float* part, int64_t rows, int64_t cols, int64_t begin, float* whole,
                          int64_t width) override {
    group_.posted_[static_cast<size_t>(rank_)] = {part, cols, begin};
    group_.arrive_and_wait();
    for (const HostGroup::Part& p : group_.posted_)
      for (int64_t r = 0; r < rows; ++r) std::copy_n(p.data + r * p.cols, p.cols, whole + r * width + p.begin);
    group_.arrive_and_wait();  // every rank has copied every part
  }

 private:
  HostGroup& group_;
  int rank_;
  std::vector<float> sum_;
};

HostGroup::HostGroup(int ranks) : ranks_(ranks), posted_(static_cast<size_t>(ranks)) {
  if (ranks < 1) fail(ErrorCategory::kInvalidArgument, "a tensor-parallel group needs at least 1 rank, got {}", ranks);
}

void HostGroup::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) fail(ErrorCategory::kInternal, "tensor-parallel step abandoned: another rank failed");
  const uint64_t generation = generation_;
  if (++arrived_ == ranks_) {
    arrived_ = 0;
    ++generation_;
    all_arrived_.notify_all();
    return;
  }
  all_arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) fail(ErrorCategory::kInternal, "tensor-parallel step abandoned: another rank failed");
}

void HostGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  all_arrived_.notify_all();
}

void HostGroup::reset() {
  std::lock_guard lock(mutex_);
  aborted_ = false;
  arrived_ = 0;
}

std::unique_ptr<Collective> HostGroup::member(int rank) {
  if (rank < 0 || rank >= ranks_) fail(ErrorCategory::kInvalidArgument, "rank {} outside a group of {}", rank, ranks_);
  return std::make_unique<HostCollective>(*this, rank);
}

}  // namespace kettle
