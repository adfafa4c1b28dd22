// ThreadPool: a decode step issues a few hundred small ops, so hand-off
// latency matters. Workers spin on a generation counter for a short while
// (~100 µs) before sleeping on a condition variable, and the caller spins
// for completion; an idle pool sleeps and costs nothing.
#include "util/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define KETTLE_CPU_RELAX() _mm_pause()
#else
#define KETTLE_CPU_RELAX() std::this_thread::yield()
#endif

namespace kettle {
namespace {
constexpr auto kSpinTime = std::chrono::microseconds(100);
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Returns false when the pool is stopping.
bool ThreadPool::wait_for_job(uint64_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    if (generation_.load(std::memory_order_acquire) != seen) return true;
    if (stopping_.load(std::memory_order_relaxed)) return false;
    KETTLE_CPU_RELAX();
    if ((i & 255) == 255 && std::chrono::steady_clock::now() > deadline) break;
  }
  std::unique_lock lock(mutex_);
  ++sleeping_;
  wake_.wait(lock, [&] { return stopping_ || generation_.load(std::memory_order_acquire) != seen; });
  --sleeping_;
  return !stopping_;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (wait_for_job(seen)) {
    seen = generation_.load(std::memory_order_acquire);
    (*job_)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleeping_ > 0) wake_.notify_all();
  }
  fn(0, n_threads_);
  while (pending_.load(std::memory_order_acquire) != 0) KETTLE_CPU_RELAX();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  run([&](int, int) {
    for (;;) {
      int64_t begin = next.fetch_add(grain);
      if (begin >= n) break;
      fn(begin, std::min(n, begin + grain));
    }
  });
}

}  // namespace kettle
