// The hand-off between the engine thread and an HTTP thread: an EventChannel is
// the GenerationSink of one request (text pieces, then done or error, queued for
// the HTTP thread to pop), plus the cancel flag the engine checks between steps.
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

#include "engine/request.h"
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
  bool speculative = false;            // kDone: the engine drafted (--draft-kind); drafted/accepted hold
  int64_t drafted = 0, accepted = 0;   // kDone: speculation's drafted tokens, and of them accepted
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
class EventChannel final : public GenerationSink {
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
  bool cancelled() const override { return cancelled_.load(); }

  // GenerationSink: the engine's output as events.
  void on_output(GenerationOutput output) override {
    if (output.text.empty() && output.logprobs.empty()) return;
    Event e;
    e.text = std::move(output.text);
    for (TokenReport& t : output.logprobs) {
      TokenLogprob lp{t.id, std::move(t.text), t.logprob, {}};
      for (TokenReport& alt : t.top) lp.top.push_back({alt.id, std::move(alt.text), alt.logprob});
      e.logprobs.push_back(std::move(lp));
    }
    push(std::move(e));
  }
  void on_end(const GenerationEnd& end) override {
    if (end.finish_reason == "cancelled") return push(Event::error("generation cancelled: " + end.error));
    if (!end.ok()) return push(Event::error(end.error));
    Event e;
    e.kind = Event::Kind::kDone;
    e.finish_reason = end.finish_reason;
    e.stop_sequence = end.stop_sequence;
    e.prompt_tokens = end.prompt_tokens;
    e.completion_tokens = end.completion_tokens;
    e.cached_tokens = end.cached_tokens;
    e.speculative = end.speculative;
    e.drafted = end.drafted;
    e.accepted = end.accepted;
    e.queue_seconds = end.queue_seconds;
    e.prefill_seconds = end.prefill_seconds;
    e.decode_seconds = end.decode_seconds;
    push(std::move(e));
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace kettle::server
