// Sliding-window perplexity through the engine: each window a prompt that is only
// scored; the engine's log-softmax is in double, so long files do not lose digits
// in the sum.
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"
#include "util/timer.h"

namespace kettle {
namespace {

// Collects a scored prompt's log-probabilities by position.
class ScoreSink final : public GenerationSink {
 public:
  explicit ScoreSink(int64_t positions) : logprobs(static_cast<size_t>(positions), 0.0) {}
  void on_output(GenerationOutput out) override {
    for (size_t i = 0; i < out.prompt_logprobs.size(); ++i)
      logprobs[static_cast<size_t>(out.first_position) + i] = out.prompt_logprobs[i];
  }
  void on_end(const GenerationEnd& e) override { end = e; }
  std::vector<double> logprobs;  // [p]: log p(token p + 1 | tokens up to p)
  GenerationEnd end;
};

}  // namespace

PerplexityResult perplexity(EngineCore& core, const std::vector<int32_t>& ids, int64_t context, int64_t stride,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = core.runner().spec().vocab_size;
  if (n < 2) fail(ErrorCategory::kInvalidArgument, "perplexity needs at least 2 tokens, the text has {}", n);
  if (context < 2) fail(ErrorCategory::kInvalidArgument, "--context must be at least 2, got {}", context);
  if (stride < 1 || stride > context)
    fail(ErrorCategory::kInvalidArgument, "--stride must be between 1 and --context ({}), got {}", context, stride);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail(ErrorCategory::kInvalidArgument, "token {} is outside the vocabulary [0, {})", id, vocab);

  int64_t total_windows = 0;
  for (int64_t begin = 0;; begin += stride) {
    ++total_windows;
    if (begin + context >= n) break;
  }
  PerplexityResult result;
  Timer timer;
  double nll_sum = 0.0;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + context, n);
    const int64_t window = end - begin;
    const int64_t target_len = end - prev_end;  // tokens no earlier window scored
    // The window as a prompt that is only scored, through the engine's step loop.
    GenerationRequest request;
    request.prompt.assign(ids.begin() + begin, ids.begin() + end);
    request.max_tokens = 0;
    request.prompt_logprobs = true;
    auto sink = std::make_shared<ScoreSink>(window);
    core.submit(std::move(request), sink);
    core.run_until_idle();
    if (!sink->end.ok()) fail(sink->end.error_category, "perplexity: window at token {} failed: {}", begin, sink->end.error);
    // Window position j (>= 1) is predicted by the logits at j - 1.
    for (int64_t j = std::max<int64_t>(1, window - target_len); j < window; ++j) {
      nll_sum -= sink->logprobs[static_cast<size_t>(j - 1)];
      ++result.scored_tokens;
    }
    ++result.windows;
    prev_end = end;
    if (progress) progress(result.windows, total_windows, std::exp(nll_sum / static_cast<double>(result.scored_tokens)));
    if (end == n) break;
  }
  result.mean_nll = nll_sum / static_cast<double>(result.scored_tokens);
  result.perplexity = std::exp(result.mean_nll);
  result.seconds = timer.seconds();
  return result;
}

}  // namespace kettle
