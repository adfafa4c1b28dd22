// Sliding-window perplexity; log-softmax in double so long files do not lose
// digits in the sum.
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "tensor/host_buffer.h"
#include "util/error.h"
#include "util/timer.h"

namespace kettle {
namespace {

// -log softmax(row)[target]
double token_nll(const float* row, int64_t vocab, int32_t target) {
  const float max_logit = *std::max_element(row, row + vocab);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max_logit);
  return std::log(sum) - (static_cast<double>(row[target]) - max_logit);
}

}  // namespace

PerplexityResult perplexity(ModelRunner& runner, const std::vector<int32_t>& ids, int64_t context, int64_t stride,
                            const std::function<void(int64_t, int64_t, double)>& progress) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t vocab = runner.spec().vocab_size;
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
  HostBuffer<float> logits(static_cast<size_t>(std::min(context, n) * vocab));  // [window, vocab]
  double nll_sum = 0.0;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + context, n);
    const int64_t window = end - begin;
    const int64_t target_len = end - prev_end;  // tokens no earlier window scored
    KvCache kv = runner.new_cache();
    runner.forward(ids.data() + begin, window, kv, LogitsFor::kAllTokens, logits.data());
    // Window position j (>= 1) is predicted by the logits at j - 1.
    for (int64_t j = std::max<int64_t>(1, window - target_len); j < window; ++j) {
      nll_sum += token_nll(logits.data() + (j - 1) * vocab, vocab, ids[static_cast<size_t>(begin + j)]);
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
