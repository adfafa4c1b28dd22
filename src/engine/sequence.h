// Sequence: one generation in the engine — its request, where it stands (the
// prompt and the tokens produced so far, how many of them the KV cache holds),
// its sampler, its text machinery (StreamDecoder, StopMatcher) and its sink.
// Everything but the KV cache can be written out (save) and read back
// (restore): a restored sequence prefills what it had and goes on drawing
// exactly what the original would have — what the SSD tier and resumable
// generations persist.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/speculation.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

namespace kettle {

class Sequence {
 public:
  // tokenizer may be null: no text, and no stop strings (refused).
  Sequence(GenerationRequest request, std::shared_ptr<GenerationSink> sink, const Tokenizer* tokenizer, int64_t vocab);
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  const GenerationRequest& request() const { return request_; }
  GenerationSink& sink() const { return *sink_; }

  // The prompt, then every token produced: the context whose KV the cache holds (all but
  // the last token while decoding).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t prompt_size() const { return static_cast<int64_t>(request_.prompt.size()); }
  int64_t produced() const { return static_cast<int64_t>(tokens_.size()) - prompt_size(); }
  // Positions whose KV is computed (the cache's length).
  int64_t fed() const { return fed_; }
  // Tokens still to run before the next draw: the whole context past fed().
  int64_t pending() const { return static_cast<int64_t>(tokens_.size()) - fed_; }
  // True once it has drawn a token since it started (or was restored): its next step is a decode.
  bool decoding() const { return decoding_; }

  // Drafted continuations the next step verifies (speculation); empty: none.
  std::vector<int32_t>& draft() { return draft_; }
  // What a verify step feeds: the last token, then the drafts (kept here until the next plan).
  std::span<const int32_t> verify_input();

  // Records that `n` more positions are in the cache (after a step ran them), or that only
  // the first `fed` are (rejected drafts rolled back).
  void advance(int64_t n) { fed_ += n; }
  void rewind(int64_t fed) { fed_ = fed; }
  // One drawn token: its text to the sink (held back while a stop string may be forming),
  // then whether the generation ends (an end-of-sequence id, a stop string, max_tokens).
  void accept(const SampledToken& sampled, const std::vector<int>& eos_ids);
  // The prompt's scores for `positions` positions from `first` (GenerationRequest::prompt_logprobs).
  void emit_prompt_logprobs(int64_t first, std::vector<double> logprobs);
  // Whether every prompt position's output row is read (scored prompts, mean and CLS
  // pooling): all of them are run, none adopted from the prefix cache.
  bool reads_every_prompt_row() const {
    return request_.prompt_logprobs || request_.pooling == Pooling::kMean || request_.pooling == Pooling::kCls;
  }
  // An embedding (GenerationRequest::pooling): the final hidden states of prompt positions
  // [first, first + n), `width` floats each; once the last position is in, the pooled
  // vector goes to the sink.
  void pool(int64_t first, const float* rows, int64_t n, int64_t width);
  // Sampler bookkeeping for a token drawn on the device.
  Sampler& sampler() { return sampler_; }
  // Constrained decoding (GenerationRequest::constraint): whether the next token is masked,
  // and its mask (ceil(vocab / 32) words). False when the grammar allows no token at all
  // (the sequence is then finished with an error).
  bool constrained() const { return constraint_.has_value(); }
  bool fill_mask(std::span<uint32_t> words);

  bool finished() const { return !finish_reason_.empty(); }
  const std::string& finish_reason() const { return finish_reason_; }
  void finish(std::string reason, std::string why = {});
  // The end report, after flushing what the text machinery still holds (a normal end).
  GenerationEnd end_report();

  // The KV cache and the prefix-cache hold, while the sequence runs.
  std::optional<KvCache> kv;
  PrefixCache::Hold prefix_hold;
  int64_t cached_tokens = 0;  // prompt positions adopted from the prefix cache
  int64_t restore_ticket = 0;  // waiting for its prefix blocks to come back from disk (SsdTier); 0: not
  std::optional<Sha256Digest> checkpoint_key;  // --generation-checkpoint: its request's identity
  int64_t checkpointed = 0;                    // tokens produced at its last checkpoint
  DraftState speculation;                      // its drafts' count and acceptance (speculation.h)
  size_t kv_reserved = 0;     // bytes admitted against the KV budget
  double queue_seconds = 0.0;
  // Timing, from admission.
  void started() { since_joined_.reset(); }

  // Everything but the KV cache, as JSON; restore() reads it back with the same tokenizer
  // and vocabulary.
  nlohmann::json save() const;
  // A checkpoint of the same request (save()) taken up: its tokens are drawn again as they
  // were — their text goes to this sequence's sink, as the interrupted run sent it — and
  // the sampler goes on from the saved state. Before the sequence runs.
  void replay(const nlohmann::json& state, const std::vector<int>& eos_ids, int64_t vocab);
  // save() without what changes as the generation goes on: the request's identity.
  nlohmann::json request_identity() const;
  static std::unique_ptr<Sequence> restore(const nlohmann::json& state, std::shared_ptr<GenerationSink> sink,
                                           const Tokenizer* tokenizer, int64_t vocab);

 private:
  void emit(std::string text, std::span<const int32_t> ids, std::vector<TokenReport> logprobs);

  GenerationRequest request_;
  std::shared_ptr<GenerationSink> sink_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> tokens_;
  int64_t fed_ = 0;
  bool decoding_ = false;
  std::vector<int32_t> draft_, verify_input_;
  Sampler sampler_;
  std::optional<StreamDecoder> decoder_;
  std::optional<grammar::ConstraintMatcher> constraint_;
  std::vector<double> pooled_;  // an embedding's running sum (mean) or chosen row
  StopMatcher matcher_;
  std::string finish_reason_, why_;
  Timer since_joined_, since_first_token_;
  double prefill_seconds_ = 0.0;
};

}  // namespace kettle
