// Logit adjustments (transformers' RepetitionPenaltyLogitsProcessor, OpenAI's
// presence/frequency penalties and logit_bias), the sampling warpers as
// transformers applies them (TemperatureLogitsWarper, TopKLogitsWarper,
// TopPLogitsWarper, MinPLogitsWarper), a draw, and log-probabilities.
#include "engine/sampler.h"

#include <sstream>

#include "backend/cpu/sample_row.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace kettle {

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

void validate_sampling(const SamplingParams& p, int64_t vocab) {
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    fail(ErrorCategory::kInvalidArgument, "repetition_penalty {} is out of range: expected a number > 0 (1 = off)",
         p.repetition_penalty);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    fail(ErrorCategory::kInvalidArgument, "presence_penalty {} is out of range: expected -2 to 2", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    fail(ErrorCategory::kInvalidArgument, "frequency_penalty {} is out of range: expected -2 to 2",
         p.frequency_penalty);
  if (p.top_logprobs < 0 || p.top_logprobs > 20)
    fail(ErrorCategory::kInvalidArgument, "top_logprobs {} is out of range: expected 0 to 20", p.top_logprobs);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab)
      fail(ErrorCategory::kInvalidArgument, "logit_bias token {} is outside the vocabulary [0, {})", id, vocab);
    if (!std::isfinite(bias))
      fail(ErrorCategory::kInvalidArgument, "logit_bias for token {} is not a finite number", id);
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

bool Sampler::adjusts_logits() const {
  return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f ||
         !params_.logit_bias.empty();
}

void Sampler::start(std::span<const int32_t> prompt, int64_t vocab, int64_t max_new_tokens) {
  seen_ids_.clear();
  output_ids_.clear();
  seen_.clear();
  output_count_.clear();
  const size_t n_vocab = static_cast<size_t>(std::max<int64_t>(vocab, 0));
  const size_t n_new = static_cast<size_t>(std::max<int64_t>(max_new_tokens, 0));
  if (params_.repetition_penalty != 1.0f) {
    seen_.assign(n_vocab, 0);
    seen_ids_.reserve(std::min(n_vocab, prompt.size() + n_new));
    for (int32_t id : prompt) accept_seen(id);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    output_count_.assign(n_vocab, 0);
    output_ids_.reserve(std::min(n_vocab, n_new));
  }
  if (adjusts_logits()) adjusted_.reserve(n_vocab);
}

void Sampler::accept_seen(int32_t id) {
  if (id < 0) return;
  if (static_cast<size_t>(id) >= seen_.size()) seen_.resize(static_cast<size_t>(id) + 1, 0);
  if (!seen_[static_cast<size_t>(id)]) {
    seen_[static_cast<size_t>(id)] = 1;
    seen_ids_.push_back(id);
  }
}

void Sampler::accept(int32_t id) {
  if (id < 0) return;
  if (params_.repetition_penalty != 1.0f) accept_seen(id);
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    if (static_cast<size_t>(id) >= output_count_.size()) output_count_.resize(static_cast<size_t>(id) + 1, 0);
    if (output_count_[static_cast<size_t>(id)]++ == 0) output_ids_.push_back(id);
  }
}

const float* Sampler::processed_logits(const float* logits, int64_t vocab) {
  if (!adjusts_logits()) return logits;
  adjusted_.assign(logits, logits + vocab);
  float* l = adjusted_.data();
  if (const float p = params_.repetition_penalty; p != 1.0f)
    for (int32_t id : seen_ids_)
      if (id < vocab) l[id] = l[id] > 0.0f ? l[id] / p : l[id] * p;
  // vLLM's order: frequency, then presence.
  for (int32_t id : output_ids_) {
    if (id >= vocab) continue;
    l[id] -= params_.frequency_penalty * static_cast<float>(output_count_[static_cast<size_t>(id)]);
    l[id] -= params_.presence_penalty;
  }
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < vocab) l[id] += bias;
  return l;
}

SampledToken Sampler::sample(const float* logits, int64_t vocab) {
  const float* l = processed_logits(logits, vocab);
  SampledToken token;
  token.id = params_.temperature <= 0.0f ? argmax(l, vocab) : draw(l, vocab);
  if (params_.logprobs) fill_logprobs(l, vocab, token);
  accept(token.id);
  return token;
}

SampleRow Sampler::rule() const { return {params_.temperature, params_.top_k, params_.top_p, params_.min_p, 0.0f}; }

std::string Sampler::rng_state() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void Sampler::set_rng_state(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 rng;
  in >> rng;
  if (!in) fail(ErrorCategory::kInvalidArgument, "a sampler's saved generator state is not one");
  rng_ = rng;
}

double Sampler::next_uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::draw(const float* logits, int64_t vocab) {
  return cpu::sample_row(logits, vocab, rule(), next_uniform(), candidates_);
}

// One uniform per drawn token, as draw() takes it, so both paths walk the same sequence.
SampleRow Sampler::device_row() {
  SampleRow row = rule();
  if (row.temperature > 0.0f) row.uniform = static_cast<float>(next_uniform());
  return row;
}

// log-softmax in double; the top alternatives by one pass keeping a sorted
// list of at most top_logprobs entries (ties: the lower id first).
void Sampler::fill_logprobs(const float* logits, int64_t vocab, SampledToken& token) {
  double max = logits[argmax(logits, vocab)];
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  token.logprob = static_cast<float>(logits[token.id] - log_z);

  const size_t n = static_cast<size_t>(std::min<int64_t>(params_.top_logprobs, vocab));
  if (n == 0) return;
  auto& top = token.top;  // holds raw logits until the end
  top.reserve(n);
  for (int64_t i = 0; i < vocab; ++i) {
    float l = logits[i];
    if (top.size() == n && !(l > top.back().logprob)) continue;
    auto at = std::upper_bound(top.begin(), top.end(), l, [](float v, const TokenLogprob& e) { return v > e.logprob; });
    const auto index = at - top.begin();
    if (top.size() == n) top.pop_back();
    top.insert(top.begin() + index, TokenLogprob{static_cast<int32_t>(i), l});
  }
  for (auto& e : top) e.logprob = static_cast<float>(e.logprob - log_z);
}

}  // namespace kettle
