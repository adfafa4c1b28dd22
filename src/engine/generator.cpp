// Prefill once, then one forward per new token; stops at an end-of-sequence
// id or max_tokens. Validates the prompt before any work.
#include "engine/generator.h"

#include <algorithm>
#include <fstream>

#include "tensor/host_buffer.h"
#include "util/error.h"
#include "util/timer.h"

namespace kettle {

SamplingParams default_sampling(const GenerationDefaults& d) {
  SamplingParams p;
  // transformers adds RepetitionPenaltyLogitsProcessor whether or not it samples.
  p.repetition_penalty = d.repetition_penalty;
  if (!d.do_sample) return p;  // greedy
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  return p;
}

GenerationResult generate(ModelRunner& transformer, const GenerationRequest& request,
                          const std::function<void(const SampledToken&)>& on_token) {
  const ModelSpec& spec = transformer.spec();
  if (request.prompt.empty()) fail(ErrorCategory::kInvalidArgument, "the prompt is empty: give at least one token");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    int32_t id = request.prompt[i];
    if (id < 0 || id >= spec.vocab_size)
      fail(ErrorCategory::kInvalidArgument, "prompt token {} (position {}) is outside the vocabulary [0, {})", id, i,
           spec.vocab_size);
  }
  validate_sampling(request.sampling, spec.vocab_size);
  GenerationResult result;
  result.finish_reason = "length";
  KvCache kv = transformer.new_cache();
  Sampler sampler(request.sampling);
  sampler.start(request.prompt, spec.vocab_size, request.max_tokens);
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const bool dump = !request.logits_dump_path.empty();
  HostBuffer<float> logits(static_cast<size_t>((dump ? n : 1) * spec.vocab_size));

  if (request.should_stop && request.should_stop()) {
    result.finish_reason = "cancelled";
    return result;
  }
  Timer timer;
  transformer.forward(request.prompt.data(), n, kv, dump ? LogitsFor::kAllTokens : LogitsFor::kLastToken, logits.data());
  result.prefill_ms = timer.millis();
  if (dump) {
    std::ofstream out(request.logits_dump_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    if (!out) fail(ErrorCategory::kInvalidArgument, "cannot write logits to {}", request.logits_dump_path);
  }
  const float* last = logits.data() + (dump ? (n - 1) * spec.vocab_size : 0);

  timer.reset();
  for (int64_t step = 0; step < request.max_tokens; ++step) {
    SampledToken sampled = sampler.sample(step == 0 ? last : logits.data(), spec.vocab_size);
    int32_t token = sampled.id;
    result.tokens.push_back(token);
    if (on_token) on_token(sampled);
    if (std::find(request.stop_ids.begin(), request.stop_ids.end(), token) != request.stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (step + 1 == request.max_tokens) break;
    if (request.should_stop && request.should_stop()) {
      result.finish_reason = "cancelled";
      break;
    }
    transformer.forward(&token, 1, kv, LogitsFor::kLastToken, logits.data());
  }
  result.decode_ms = timer.millis();
  return result;
}

}  // namespace kettle
