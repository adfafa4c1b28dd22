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
  for (const auto& [name, size] : {std::pair{"repetition_context_size", p.repetition_context_size},
                                    std::pair{"presence_context_size", p.presence_context_size},
                                    std::pair{"frequency_context_size", p.frequency_context_size}})
    if (size < 0) fail(ErrorCategory::kInvalidArgument, "{} {} is out of range: expected ≥ 0 (0 = all)", name, size);
  if (!(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f))
    fail(ErrorCategory::kInvalidArgument, "xtc_probability {} is out of range: expected 0 to 1", p.xtc_probability);
  if (!(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f))
    fail(ErrorCategory::kInvalidArgument, "xtc_threshold {} is out of range: expected 0 to 1", p.xtc_threshold);
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

void TokenCounts::reset(size_t vocab, size_t limit, size_t reserve) {
  limit_ = limit;
  window_.clear();
  count_.assign(vocab, 0);
  listed_.assign(vocab, 0);
  ids_.clear();
  ids_.reserve(std::min(vocab, reserve));
}

void TokenCounts::add(int32_t id) {
  if (id < 0) return;
  const auto i = static_cast<size_t>(id);
  if (i >= count_.size()) count_.resize(i + 1, 0), listed_.resize(i + 1, 0);
  if (count_[i]++ == 0 && !listed_[i]) {
    listed_[i] = 1;
    ids_.push_back(id);
  }
  if (limit_ == 0) return;
  window_.push_back(id);
  if (window_.size() > limit_) {
    --count_[static_cast<size_t>(window_.front())];
    window_.pop_front();
  }
}

void Sampler::start(std::span<const int32_t> prompt, int64_t vocab, int64_t max_new_tokens) {
  const size_t n_vocab = static_cast<size_t>(std::max<int64_t>(vocab, 0));
  const size_t n_new = static_cast<size_t>(std::max<int64_t>(max_new_tokens, 0));
  const auto window = [](int64_t size) { return static_cast<size_t>(std::max<int64_t>(size, 0)); };
  seen_ = TokenCounts{};
  output_ = TokenCounts{};
  presence_output_ = TokenCounts{};
  if (params_.repetition_penalty != 1.0f) {
    seen_.reset(n_vocab, window(params_.repetition_context_size), prompt.size() + n_new);
    for (int32_t id : prompt) seen_.add(id);
  }
  if (params_.frequency_penalty != 0.0f || (params_.presence_penalty != 0.0f && shared_output_counts()))
    output_.reset(n_vocab, window(params_.frequency_context_size), n_new);
  if (params_.presence_penalty != 0.0f && !shared_output_counts())
    presence_output_.reset(n_vocab, window(params_.presence_context_size), n_new);
  if (adjusts_logits()) adjusted_.reserve(n_vocab);
}

void Sampler::accept(int32_t id) {
  if (id < 0) return;
  if (!seen_.empty()) seen_.add(id);
  if (!output_.empty()) output_.add(id);
  if (!presence_output_.empty()) presence_output_.add(id);
}

const float* Sampler::processed_logits(const float* logits, int64_t vocab) {
  if (!adjusts_logits()) return logits;
  adjusted_.assign(logits, logits + vocab);
  float* l = adjusted_.data();
  if (const float p = params_.repetition_penalty; p != 1.0f)
    seen_.for_each([&](int32_t id, int32_t) {
      if (id < vocab) l[id] = l[id] > 0.0f ? l[id] / p : l[id] * p;
    });
  // vLLM's order: frequency, then presence (per token).
  const bool shared = shared_output_counts();
  output_.for_each([&](int32_t id, int32_t count) {
    if (id >= vocab) return;
    l[id] -= params_.frequency_penalty * static_cast<float>(count);
    if (shared) l[id] -= params_.presence_penalty;
  });
  if (!shared)
    presence_output_.for_each([&](int32_t id, int32_t) {
      if (id < vocab) l[id] -= params_.presence_penalty;
    });
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < vocab) l[id] += bias;
  return l;
}

SampledToken Sampler::sample(const float* logits, int64_t vocab, const uint32_t* mask) {
  const float* l = processed_logits(logits, vocab);
  if (mask != nullptr) {
    masked_.assign(l, l + vocab);
    for (int64_t i = 0; i < vocab; ++i)
      if (!((mask[i / 32] >> (i % 32)) & 1u)) masked_[static_cast<size_t>(i)] = -INFINITY;
    l = masked_.data();
  }
  const float* pick = l;
  if (params_.xtc_probability > 0.0f && next_uniform() < params_.xtc_probability) pick = exclude_top_choices(l, vocab);
  SampledToken token;
  token.id = params_.temperature <= 0.0f ? argmax(pick, vocab) : draw(pick, vocab);
  if (params_.logprobs) fill_logprobs(l, vocab, token);
  accept(token.id);
  return token;
}

const float* Sampler::exclude_top_choices(const float* logits, int64_t vocab) {
  const double t = params_.temperature > 0.0f ? params_.temperature : 1.0;
  const double max = logits[argmax(logits, vocab)];
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp((static_cast<double>(logits[i]) - max) / t);
  // A token reaches the threshold when exp((l - max) / t) ≥ threshold · sum.
  const double bar = params_.xtc_threshold * sum;
  int64_t reached = 0, least = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::exp((static_cast<double>(logits[i]) - max) / t) < bar) continue;
    ++reached;
    if (least < 0 || logits[i] < logits[least] || (logits[i] == logits[least] && i > least)) least = i;
  }
  if (reached < 2) return logits;
  xtc_.assign(logits, logits + vocab);
  for (int64_t i = 0; i < vocab; ++i)
    if (i != least && std::exp((static_cast<double>(logits[i]) - max) / t) >= bar) xtc_[static_cast<size_t>(i)] = -INFINITY;
  return xtc_.data();
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
    if (l == -INFINITY) continue;  // masked out: not an alternative
    if (top.size() == n && !(l > top.back().logprob)) continue;
    auto at = std::upper_bound(top.begin(), top.end(), l, [](float v, const TokenLogprob& e) { return v > e.logprob; });
    const auto index = at - top.begin();
    if (top.size() == n) top.pop_back();
    top.insert(top.begin() + index, TokenLogprob{static_cast<int32_t>(i), l});
  }
  for (auto& e : top) e.logprob = static_cast<float>(e.logprob - log_z);
}

}  // namespace kettle
