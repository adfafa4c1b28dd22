// A sequence's token bookkeeping and text path: a drawn token goes through the
// StreamDecoder (never half a character) and the StopMatcher (stop strings
// held back until they can no longer match) to the sink; save/restore write
// the whole state as versioned JSON.
#include "engine/sequence.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace kettle {
namespace {

constexpr int kStateVersion = 1;

nlohmann::json sampling_json(const SamplingParams& p) {
  return {{"temperature", p.temperature},
          {"top_k", p.top_k},
          {"top_p", p.top_p},
          {"min_p", p.min_p},
          {"seed", p.seed},
          {"repetition_penalty", p.repetition_penalty},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"repetition_context_size", p.repetition_context_size},
          {"presence_context_size", p.presence_context_size},
          {"frequency_context_size", p.frequency_context_size},
          {"xtc_probability", p.xtc_probability},
          {"xtc_threshold", p.xtc_threshold},
          {"logit_bias", p.logit_bias},
          {"logprobs", p.logprobs},
          {"top_logprobs", p.top_logprobs}};
}

SamplingParams sampling_from(const nlohmann::json& j) {
  SamplingParams p;
  p.temperature = j.at("temperature").get<float>();
  p.top_k = j.at("top_k").get<int>();
  p.top_p = j.at("top_p").get<float>();
  p.min_p = j.at("min_p").get<float>();
  p.seed = j.at("seed").get<uint64_t>();
  p.repetition_penalty = j.at("repetition_penalty").get<float>();
  p.presence_penalty = j.at("presence_penalty").get<float>();
  p.frequency_penalty = j.at("frequency_penalty").get<float>();
  // Absent from states written before these existed: whole-context penalties, no XTC.
  p.repetition_context_size = j.value("repetition_context_size", int64_t{0});
  p.presence_context_size = j.value("presence_context_size", int64_t{0});
  p.frequency_context_size = j.value("frequency_context_size", int64_t{0});
  p.xtc_probability = j.value("xtc_probability", 0.0f);
  p.xtc_threshold = j.value("xtc_threshold", 0.1f);
  p.logit_bias = j.at("logit_bias").get<std::vector<std::pair<int32_t, float>>>();
  p.logprobs = j.at("logprobs").get<bool>();
  p.top_logprobs = j.at("top_logprobs").get<int>();
  return p;
}

}  // namespace

Sequence::Sequence(GenerationRequest request, std::shared_ptr<GenerationSink> sink, const Tokenizer* tokenizer,
                   int64_t vocab)
    : request_(std::move(request)),
      sink_(std::move(sink)),
      tokenizer_(tokenizer),
      tokens_(request_.prompt),
      sampler_(request_.sampling),
      matcher_(request_.stop) {
  if (request_.prompt.empty()) fail(ErrorCategory::kInvalidArgument, "the prompt is empty: give at least one token");
  if (request_.max_tokens < 0) fail(ErrorCategory::kInvalidArgument, "max_tokens is {}: give 0 or more", request_.max_tokens);
  for (size_t i = 0; i < request_.prompt.size(); ++i)
    if (request_.prompt[i] < 0 || request_.prompt[i] >= vocab)
      fail(ErrorCategory::kInvalidArgument, "prompt token {} (position {}) is outside the model's vocabulary [0, {})",
           request_.prompt[i], i, vocab);
  validate_sampling(request_.sampling, vocab);
  if (tokenizer_ == nullptr && std::any_of(request_.stop.begin(), request_.stop.end(), [](auto& s) { return !s.empty(); }))
    fail(ErrorCategory::kInvalidArgument, "stop strings need the model's tokenizer, and this engine has none");
  if (tokenizer_ != nullptr) decoder_.emplace(*tokenizer_);
  if (request_.constraint) {
    if (request_.constraint->vocabulary().size() > vocab)
      fail(ErrorCategory::kInvalidArgument, "a constraint over {} tokens for a model of {}",
           request_.constraint->vocabulary().size(), vocab);
    constraint_.emplace(request_.constraint);
  }
  if (request_.pooling != Pooling::kNone &&
      (request_.max_tokens != 0 || request_.prompt_logprobs || request_.constraint))
    fail(ErrorCategory::kInvalidArgument, "an embedding draws nothing: max_tokens 0, no prompt_logprobs, no constraint");
  sampler_.start(request_.prompt, vocab, request_.max_tokens);
}

void Sequence::emit(std::string text, std::span<const int32_t> ids, std::vector<TokenReport> logprobs) {
  if (text.empty() && ids.empty() && logprobs.empty()) return;
  sink_->on_output({std::move(text), ids, std::move(logprobs), {}, 0, {}});
}

std::span<const int32_t> Sequence::verify_input() {
  verify_input_.assign(1, tokens_.back());
  verify_input_.insert(verify_input_.end(), draft_.begin(), draft_.end());
  return verify_input_;
}

void Sequence::emit_prompt_logprobs(int64_t first, std::vector<double> logprobs) {
  GenerationOutput out;
  out.first_position = first;
  out.prompt_logprobs = std::move(logprobs);
  sink_->on_output(std::move(out));
}

void Sequence::pool(int64_t first, const float* rows, int64_t n, int64_t width) {
  const Pooling pooling = request_.pooling;
  if (pooled_.empty()) pooled_.assign(static_cast<size_t>(width), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t position = first + r;
    const bool take = pooling == Pooling::kMean || (pooling == Pooling::kCls && position == 0) ||
                      (pooling == Pooling::kLastToken && position == prompt_size() - 1);
    if (!take) continue;
    for (int64_t i = 0; i < width; ++i) pooled_[static_cast<size_t>(i)] += rows[r * width + i];
  }
  if (first + n < prompt_size()) return;
  if (pooling == Pooling::kMean)
    for (double& v : pooled_) v /= static_cast<double>(prompt_size());
  double scale = 1.0;
  if (request_.normalize) {
    double norm = 0.0;
    for (double v : pooled_) norm += v * v;
    scale = norm > 0.0 ? 1.0 / std::sqrt(norm) : 1.0;  // sentence-transformers leaves a zero vector as it is
  }
  GenerationOutput out;
  out.embedding.reserve(pooled_.size());
  for (double v : pooled_) out.embedding.push_back(static_cast<float>(v * scale));
  sink_->on_output(std::move(out));
}

bool Sequence::fill_mask(std::span<uint32_t> words) {
  try {
    constraint_->fill_mask(words);
  } catch (const std::exception& e) {  // a grammar past the matcher's bounds ends its generation
    finish("error", e.what());
    return false;
  }
  if (std::any_of(words.begin(), words.end(), [](uint32_t w) { return w != 0; })) return true;
  finish("error", fmt::format("the {} allows no token of this vocabulary here", constraint_->constraint().description()));
  return false;
}

void Sequence::accept(const SampledToken& sampled, const std::vector<int>& eos_ids) {
  const int32_t token = sampled.id;
  // Masks make this hold; a token that breaks the grammar anyway ends the generation.
  bool in_grammar = true;
  try {
    in_grammar = !constraint_ || constraint_->accept(token);
  } catch (const std::exception&) {
    in_grammar = false;
  }
  if (produced() == 0) {
    prefill_seconds_ = since_joined_.seconds();
    since_first_token_.reset();
  }
  tokens_.push_back(token);
  decoding_ = true;
  if (!request_.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
    emit({}, std::span<const int32_t>(&tokens_.back(), 1), {});
    finish("stop");
    return;
  }
  std::vector<TokenReport> logprobs;
  if (request_.sampling.logprobs) {
    auto text_of = [&](int32_t id) { return tokenizer_ != nullptr ? tokenizer_->decode({id}) : std::string(); };
    TokenReport report{token, text_of(token), sampled.logprob, {}};
    for (const TokenLogprob& alt : sampled.top) report.top.push_back({alt.id, text_of(alt.id), alt.logprob, {}});
    logprobs.push_back(std::move(report));
  }
  std::string text = decoder_ ? matcher_.push(decoder_->push(token)) : std::string();
  emit(std::move(text), std::span<const int32_t>(&tokens_.back(), 1), std::move(logprobs));
  if (!in_grammar)
    finish("error", fmt::format("token {} is outside the {}", token, constraint_->constraint().description()));
  else if (matcher_.stopped() || (constraint_ && constraint_->complete()))
    finish("stop");
  else if (produced() >= request_.max_tokens)
    finish("length");
}

void Sequence::finish(std::string reason, std::string why) {
  if (finished()) return;
  finish_reason_ = std::move(reason);
  why_ = std::move(why);
}

GenerationEnd Sequence::end_report() {
  GenerationEnd end;
  end.finish_reason = finish_reason_;
  end.error = why_;
  end.prompt_tokens = prompt_size();
  end.completion_tokens = produced();
  end.cached_tokens = cached_tokens;
  end.drafted = speculation.drafted;
  end.accepted = speculation.accepted;
  end.queue_seconds = queue_seconds;
  end.prefill_seconds = prefill_seconds_;
  end.decode_seconds = produced() > 1 ? since_first_token_.seconds() : 0.0;
  if (!end.ok()) return end;
  if (matcher_.stopped()) {
    end.stop_sequence = matcher_.matched();
  } else if (decoder_) {
    emit(matcher_.push(decoder_->finish()), {}, {});
    emit(matcher_.finish(), {}, {});
  }
  return end;
}

nlohmann::json Sequence::save() const {
  nlohmann::json j{{"version", kStateVersion},
                   {"prompt", request_.prompt},
                   {"produced", std::vector<int32_t>(tokens_.begin() + prompt_size(), tokens_.end())},
                   {"max_tokens", request_.max_tokens},
                   {"prompt_logprobs", request_.prompt_logprobs},
                   {"sampling", sampling_json(request_.sampling)},
                   {"stop", request_.stop},
                   {"ignore_eos", request_.ignore_eos},
                   {"cache_scope", request_.cache_scope},
                   {"rng", sampler_.rng_state()},
                   {"finish_reason", finish_reason_}};
  if (constraint_) j["constraint"] = constraint_->constraint().description();
  if (request_.pooling != Pooling::kNone) j["pooling"] = pooling_name(request_.pooling);
  if (decoder_) {
    const StreamDecoder::State d = decoder_->state();
    j["decoder"] = {{"window", d.window}, {"emitted", d.emitted}};
  }
  const StopMatcher::State m = matcher_.state();
  j["matcher"] = {{"held", m.held}, {"matched", m.matched}, {"stopped", m.stopped}};
  return j;
}

nlohmann::json Sequence::request_identity() const {
  nlohmann::json j = save();
  for (const char* key : {"produced", "rng", "finish_reason", "decoder", "matcher"}) j.erase(key);
  if (request_.sampling.temperature <= 0) j["sampling"].erase("seed");  // greedy draws the same without it
  j["route"] = request_.route;
  return j;
}

void Sequence::replay(const nlohmann::json& state, const std::vector<int>& eos_ids, int64_t vocab) {
  if (produced() != 0 || fed_ != 0) fail(ErrorCategory::kInternal, "a checkpoint is replayed before the sequence runs");
  try {
    if (state.at("prompt").get<std::vector<int32_t>>() != request_.prompt)
      fail(ErrorCategory::kInvalidData, "a checkpoint of another prompt");
    for (int32_t id : state.at("produced").get<std::vector<int32_t>>()) {
      if (id < 0 || id >= vocab) fail(ErrorCategory::kInvalidData, "a checkpoint's token {} is outside the vocabulary", id);
      sampler_.accept(id);
      accept(SampledToken{id, 0.0f, {}}, eos_ids);
      if (finished()) break;
    }
    sampler_.set_rng_state(state.at("rng").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCategory::kInvalidData, "a checkpoint is not one: {}", e.what());
  }
}

std::unique_ptr<Sequence> Sequence::restore(const nlohmann::json& j, std::shared_ptr<GenerationSink> sink,
                                            const Tokenizer* tokenizer, int64_t vocab) {
  try {
    if (j.at("version").get<int>() != kStateVersion)
      fail(ErrorCategory::kInvalidArgument, "a saved sequence of version {}; this kettle reads {}",
           j.at("version").get<int>(), kStateVersion);
    if (j.contains("pooling"))
      fail(ErrorCategory::kUnsupported, "a saved embedding ({} pooling) cannot be restored: rerun it", j["pooling"].dump());
    if (j.contains("constraint"))
      fail(ErrorCategory::kUnsupported, "a saved sequence under a constraint ({}) cannot be restored: its grammar is "
           "not part of the saved state", j["constraint"].dump());
    GenerationRequest request;
    request.prompt = j.at("prompt").get<std::vector<int32_t>>();
    request.max_tokens = j.at("max_tokens").get<int64_t>();
    request.prompt_logprobs = j.value("prompt_logprobs", false);
    request.sampling = sampling_from(j.at("sampling"));
    request.stop = j.at("stop").get<std::vector<std::string>>();
    request.ignore_eos = j.at("ignore_eos").get<bool>();
    request.cache_scope = j.at("cache_scope").get<uint64_t>();
    auto seq = std::make_unique<Sequence>(std::move(request), std::move(sink), tokenizer, vocab);
    for (int32_t id : j.at("produced").get<std::vector<int32_t>>()) {
      if (id < 0 || id >= vocab) fail(ErrorCategory::kInvalidArgument, "a saved token {} is outside the vocabulary", id);
      seq->tokens_.push_back(id);
      seq->sampler_.accept(id);
    }
    seq->sampler_.set_rng_state(j.at("rng").get<std::string>());
    seq->finish_reason_ = j.at("finish_reason").get<std::string>();
    if (seq->decoder_ && j.contains("decoder"))
      seq->decoder_->restore({j["decoder"].at("window").get<std::vector<int32_t>>(), j["decoder"].at("emitted").get<size_t>()});
    const nlohmann::json& m = j.at("matcher");
    seq->matcher_.restore({m.at("held").get<std::string>(), m.at("matched").get<std::string>(), m.at("stopped").get<bool>()});
    return seq;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCategory::kInvalidArgument, "a saved sequence is not one: {}", e.what());
  }
}

}  // namespace kettle
