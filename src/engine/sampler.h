// Sampler: next token from a row of logits. The logits are first adjusted by
// the request's penalties and bias (repetition → presence/frequency →
// logit_bias); then greedy when temperature is 0, otherwise temperature →
// top-k → top-p → min-p in transformers' order, drawn from a generator seeded
// per request so a seed reproduces a run. Optionally reports log-probabilities.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace kettle {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;
  bool seeded = false;  // the client gave the seed (a retry draws the same tokens)

  // transformers' RepetitionPenaltyLogitsProcessor: every distinct token of the
  // prompt and the output so far gets logit / p when the logit is > 0, else
  // logit * p. 1 = off; must be > 0.
  float repetition_penalty = 1.0f;
  // OpenAI / vLLM: over the generated tokens only, logit -= presence * [count > 0]
  // + frequency * count. 0 = off; each in [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Windows (mlx_lm.server's *_context_size): a penalty sees only the last N tokens of
  // what it counts (repetition: prompt + output; presence, frequency: the output).
  // 0: all of them.
  int64_t repetition_context_size = 0;
  int64_t presence_context_size = 0;
  int64_t frequency_context_size = 0;
  // XTC ("exclude top choices", text-generation-webui / llama.cpp): with probability
  // xtc_probability per token, every token whose probability (softmax at the request's
  // temperature, 1 when greedy) is at least xtc_threshold is removed but the least likely
  // of them, when there are two or more; then the pick as usual. 0 = off.
  float xtc_probability = 0.0f;
  float xtc_threshold = 0.1f;
  // OpenAI logit_bias: (token id, bias) added to the logit last, after the
  // penalties, so -100 bans and +100 forces whatever the penalties did. Ids must
  // be inside the vocabulary; a repeated id adds up.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // Log-probabilities of each sampled token and of the top_logprobs (0..20) most
  // likely alternatives. The distribution is log-softmax of the logits after
  // penalties and bias, before temperature and truncation ("processed before
  // temperature"): it is what the request asked the model to be, stays defined
  // under greedy decoding (temperature 0), and never reports -inf for a token
  // that top-k/top-p cut. Not computed (no cost) when false.
  bool logprobs = false;
  int top_logprobs = 0;
};

// Throws kettle::Error (kInvalidArgument) naming the field out of range.
void validate_sampling(const SamplingParams& params, int64_t vocab);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
  bool operator==(const TokenLogprob&) const = default;
};

// One sampled token; logprob and top are filled only when logprobs were asked for
// (top: most likely first, ties to the lower id, at most top_logprobs entries).
struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

// Per-id counts of the last `limit` tokens added (0: all of them), and the distinct ids
// among them, so a penalty walks only the ids it has seen.
class TokenCounts {
 public:
  void reset(size_t vocab, size_t limit, size_t reserve);
  void add(int32_t id);
  bool empty() const { return count_.empty(); }
  // f(id, count) for every id counted now, in first-counted order.
  template <typename F>
  void for_each(F f) {
    size_t kept = 0;
    for (int32_t id : ids_) {
      const int32_t c = count_[static_cast<size_t>(id)];
      if (c == 0) {
        listed_[static_cast<size_t>(id)] = 0;  // left the window: relisted when it returns
        continue;
      }
      ids_[kept++] = id;
      f(id, c);
    }
    ids_.resize(kept);
  }

 private:
  size_t limit_ = 0;
  std::deque<int32_t> window_;   // the last limit_ ids, when limit_ > 0
  std::vector<int32_t> count_;   // [vocab]
  std::vector<uint8_t> listed_;  // [vocab]: in ids_
  std::vector<int32_t> ids_;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // The prompt counts for the repetition penalty; the history is sized for
  // `vocab` and max_new_tokens outputs so the decode loop does not allocate.
  void start(std::span<const int32_t> prompt, int64_t vocab, int64_t max_new_tokens = 0);
  // A token the model produced (sample() records the tokens it returns).
  void accept(int32_t token);

  // `mask` (constrained decoding, Backend::mask_logits' layout for one row): tokens whose bit
  // is 0 get -inf after the penalties and bias, so neither the draw nor the logprobs see them.
  SampledToken sample(const float* logits, int64_t vocab, const uint32_t* mask = nullptr);

  // True when a token needs nothing but the logits (no penalties, bias or logprobs), so
  // a backend may draw it where the logits live: device_row() gives this step's draw
  // (its uniform taken from the request's generator exactly as sample() would).
  bool on_device() const { return !adjusts_logits() && !params_.logprobs && params_.xtc_probability <= 0.0f; }
  SampleRow device_row();

  // The logits after penalties and bias: `logits` itself when none apply, else
  // an internal buffer valid until the next call.
  const float* processed_logits(const float* logits, int64_t vocab);

  // The generator's state as text, and back: with start() and accept() of the tokens
  // produced so far, a sampler restored this way draws what the original would have.
  std::string rng_state() const;
  void set_rng_state(const std::string& state);

 private:
  bool adjusts_logits() const;
  int32_t draw(const float* logits, int64_t vocab);
  SampleRow rule() const;  // the params' temperature / top-k / top-p / min-p
  double next_uniform();   // in [0, 1), from the request's generator
  void fill_logprobs(const float* logits, int64_t vocab, SampledToken& token);
  // The logits with XTC's top choices removed (an internal buffer), or `logits` when
  // fewer than two tokens reach the threshold.
  const float* exclude_top_choices(const float* logits, int64_t vocab);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> adjusted_;  // [vocab] processed logits, when adjusts_logits()
  std::vector<float> xtc_;       // [vocab] the logits left by XTC
  std::vector<float> masked_;    // [vocab] the logits under a token mask
  bool shared_output_counts() const { return params_.presence_context_size == params_.frequency_context_size; }

  // Token history, kept only when a penalty needs it: prompt + output ids for the
  // repetition penalty, output ids for frequency (and presence, when its window is the
  // same; else its own).
  TokenCounts seen_;
  TokenCounts output_;
  TokenCounts presence_output_;
};

// argmax with the lowest index winning ties, as torch.argmax does.
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace kettle
