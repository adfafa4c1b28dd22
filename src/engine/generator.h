// Generator: one sequence, prompt to completion, on one Transformer — the
// path `kettle generate` and `kettle bench` share.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "model/generation_config.h"
#include "model/model_runner.h"

namespace kettle {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  // Warpers, penalties, logit_bias and logprobs (see sampler.h); checked by
  // validate_sampling before any work.
  SamplingParams sampling;
  std::vector<int> stop_ids;  // end of sequence ids; empty: never stop early
  std::string logits_dump_path;  // when set: f32 logits of every prompt position are written here
  // Checked before the prefill and between decode steps; true ends the run with
  // finish_reason "cancelled" (the server's disconnect / stop-string hook).
  std::function<bool()> should_stop;
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "stop" (an end-of-sequence id), "length" or "cancelled" (should_stop)
  double prefill_ms = 0.0;
  double decode_ms = 0.0;  // from the first sampled token to the last
};

// on_token (optional) sees each sampled token as it is produced, with its
// log-probabilities when request.sampling.logprobs is set.
GenerationResult generate(ModelRunner& transformer, const GenerationRequest& request,
                          const std::function<void(const SampledToken&)>& on_token = {});

// Sampling defaults from generation_config.json, as transformers would apply them.
SamplingParams default_sampling(const GenerationDefaults& defaults);

}  // namespace kettle
