// HostGroup: ranks on threads sum and gather with the same bits on every rank; a
// rank's abort releases the others from a collective (no hang), and the group works
// again after reset().
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "backend/cpu/host_collective.h"
#include "util/error.h"

namespace kettle {
namespace {

// Each of `ranks` threads sums its x (values rank + i) and gathers its column block.
void run_ranks(HostGroup& group, int ranks) {
  std::vector<std::vector<float>> sums(static_cast<size_t>(ranks)), wholes(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto me = group.member(r);
      std::vector<float>& x = sums[static_cast<size_t>(r)];
      for (int i = 0; i < 5; ++i) x.push_back(static_cast<float>(r + i) * 0.1f);
      me->all_reduce_sum(x.data(), 5);
      const std::vector<float> part{static_cast<float>(r), static_cast<float>(10 + r)};  // 2 rows × 1 column
      std::vector<float>& whole = wholes[static_cast<size_t>(r)];
      whole.assign(static_cast<size_t>(2 * ranks), -1.0f);
      me->all_gather_columns(part.data(), 2, 1, r, whole.data(), ranks);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(sums[static_cast<size_t>(r)], sums[0]) << "rank " << r;  // the same bits everywhere
    for (int i = 0; i < 5; ++i) {
      float expected = 0.0f;
      for (int j = 0; j < ranks; ++j) expected += static_cast<float>(j + i) * 0.1f;
      EXPECT_FLOAT_EQ(sums[static_cast<size_t>(r)][static_cast<size_t>(i)], expected);
    }
    for (int c = 0; c < ranks; ++c) {
      EXPECT_EQ(wholes[static_cast<size_t>(r)][static_cast<size_t>(c)], static_cast<float>(c));
      EXPECT_EQ(wholes[static_cast<size_t>(r)][static_cast<size_t>(ranks + c)], static_cast<float>(10 + c));
    }
  }
}

TEST(HostGroupTest, RanksSumAndGather) {
  for (int ranks : {1, 2, 3}) {
    HostGroup group(ranks);
    run_ranks(group, ranks);
  }
}

TEST(HostGroupTest, AbortReleasesARankWaitingInACollectiveAndResetRestoresTheGroup) {
  HostGroup group(2);
  std::exception_ptr error;
  std::thread waiting([&] {
    try {
      auto me = group.member(0);
      std::vector<float> x(4, 1.0f);
      me->all_reduce_sum(x.data(), 4);  // rank 1 never comes
    } catch (...) {
      error = std::current_exception();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group.abort();
  waiting.join();
  ASSERT_TRUE(error);
  EXPECT_THROW(std::rethrow_exception(error), Error);
  group.reset();
  run_ranks(group, 2);
}

}  // namespace
}  // namespace kettle
