// The hand-off between HTTP threads and the engine thread: a Job (one
// generation, already tokenized) and its event channel (text pieces, then done
// or error), plus the cancel flag the engine checks between decode steps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "server/turn.h"

namespace kettle::server {

struct Event {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;                    // kText: a piece of output (may be empty); kError: the message
  std::vector<TokenLogprob> logprobs;  // kText: the tokens behind it, when logprobs were asked for
  std::string finish_reason;           // kDone: "stop" or "length"
  std::string stop_sequence;           // kDone: the stop string that ended it, if one did
  int64_t prompt_tokens = 0;           // kDone
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;           // kDone: prompt tokens served from the prefix cache
  double queue_seconds = 0.0;          // kDone: waiting for the engine
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;         // after the first token

  static Event error(std::string message) {
    Event e;
    e.kind = Kind::kError;
    e.text = std::move(message);
    return e;
  }
};

// One producer (the engine), one consumer (an HTTP thread).
class EventChannel {
 public:
  void push(Event event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_one();
  }
  // The next event, or nullopt when none arrived within `timeout`.
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

struct Job {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (the eos ids always stop)
  bool ignore_eos = false;
  uint64_t cache_scope = 0;  // prefix-cache sharing only within one scope (API key + cache_salt)
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();
  size_t kv_reserved = 0;  // set by the engine on admission
  std::shared_ptr<EventChannel> channel;
};

}  // namespace kettle::server
