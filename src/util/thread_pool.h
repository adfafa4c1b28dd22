// A fixed pool of worker threads for data-parallel ops. The calling thread
// takes part as worker 0, so a pool of 1 runs everything inline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kettle {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, n_threads) once on every thread; returns when all are done.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into chunks of about `grain` items, handed out dynamically,
  // and runs fn(begin, end) for each chunk.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  static int default_threads();  // cores available to this process

 private:
  void worker_loop(int index);
  bool wait_for_job(uint64_t seen);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
  const std::function<void(int, int)>* job_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  int sleeping_ = 0;  // workers blocked on wake_ (under mutex_)
};

}  // namespace kettle
