// Perplexity of a model on a token sequence by Hugging Face's sliding-window
// recipe ("Perplexity of fixed-length models"): windows of `context` tokens
// every `stride` tokens, each scoring only the tokens no earlier window scored.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine_core.h"

namespace kettle {

struct PerplexityResult {
  double perplexity = 0.0;
  double mean_nll = 0.0;       // nats per scored token
  int64_t scored_tokens = 0;
  int64_t windows = 0;
  double seconds = 0.0;
};

// Each window runs through `core` as a prompt that is only scored (max_tokens 0,
// prompt_logprobs). progress(windows_done, windows_total, perplexity_so_far), called after
// each window.
PerplexityResult perplexity(EngineCore& core, const std::vector<int32_t>& ids, int64_t context, int64_t stride,
                            const std::function<void(int64_t, int64_t, double)>& progress = {});

}  // namespace kettle
