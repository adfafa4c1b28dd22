// Streaming detokenization for generation: StreamDecoder turns ids into text one
// token at a time without ever emitting half a character; StopMatcher holds back
// text that could still become a stop string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kettle {

// Decodes a sliding window of recent ids and emits what became stable, as
// text-generation-inference does, so the concatenation of push() outputs and
// finish() equals tokenizer.decode(all ids). The tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  std::string push(int32_t id);  // the text this id completed (often "")
  std::string finish();          // whatever is still held (an unfinished character as U+FFFD)

  // What it holds between pushes, to be written out and read back.
  struct State {
    std::vector<int32_t> window;
    size_t emitted = 0;
  };
  State state() const { return {ids_, emitted_}; }
  void restore(State state) {
    ids_ = std::move(state.window);
    emitted_ = state.emitted;
  }

 private:
  std::string decode_window() const;
  static bool is_byte_token(const std::string& token);

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the window: ids_[0] is the oldest id still decoded
  size_t emitted_ = 0;        // bytes of decode(ids_) already emitted (or context)
};

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Text safe to emit now. After a stop string completes, returns the text up
  // to it, and "" for every later call.
  std::string push(std::string_view text);
  bool stopped() const { return stopped_; }
  // The stop string that matched (valid once stopped()).
  const std::string& matched() const { return matched_; }
  // Releases the held-back text when generation ends without a stop.
  std::string finish();

  // What it holds between pushes (the stop strings are the request's), to be written
  // out and read back.
  struct State {
    std::string held, matched;
    bool stopped = false;
  };
  State state() const { return {held_, matched_, stopped_}; }
  void restore(State state) {
    held_ = std::move(state.held);
    matched_ = std::move(state.matched);
    stopped_ = state.stopped;
  }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace kettle
