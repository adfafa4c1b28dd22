// Generation through the engine with the sampler extras on a tiny real
// checkpoint: logit_bias and logprobs reach the decode loop, and the first
// token's logprobs equal a double log-softmax of the prompt's last logits as the
// engine's own runner computes them in a prefill of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;

struct TinyModel {
  Model model = load_model((fs::path(KETTLE_TEST_DATA) / "goldens" / "llama" / "model").string());
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  EngineCore core{model, nullptr, {backend.get()}, EngineOptions{}};
};

TEST(Generate, LogitBiasForcesEveryStep) {
  TinyModel tiny;
  GenerationRequest request;
  request.prompt = {1, 17, 42, 99};
  request.max_tokens = 6;
  request.sampling.logit_bias = {{123, 100.0f}};
  EXPECT_EQ(generate(tiny.core, request).tokens, std::vector<int32_t>(6, 123));
}

TEST(Generate, LogprobsOfTheFirstTokenEqualLogSoftmaxOfThePromptLogits) {
  TinyModel tiny;
  const int64_t vocab = tiny.model.spec.vocab_size;
  GenerationRequest request;
  request.prompt = {1, 5, 9};
  request.max_tokens = 4;
  request.sampling.logprobs = true;
  request.sampling.top_logprobs = 5;
  std::vector<TokenReport> seen;
  GenerationResult result = generate(tiny.core, request, [&](const GenerationOutput& out) {
    seen.insert(seen.end(), out.logprobs.begin(), out.logprobs.end());
  });
  ASSERT_TRUE(result.end.ok()) << result.end.error;
  ASSERT_EQ(seen.size(), result.tokens.size());

  std::vector<float> logits(static_cast<size_t>(3 * vocab));
  KvCache kv(tiny.core.pool());
  tiny.core.runner().forward(request.prompt.data(), 3, kv, LogitsFor::kAllTokens, logits.data());
  const float* last = logits.data() + 2 * vocab;
  double m = *std::max_element(last, last + vocab), z = 0.0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(last[i] - m);
  auto logprob = [&](int32_t id) { return last[id] - m - std::log(z); };
  EXPECT_NEAR(seen[0].logprob, logprob(seen[0].id), 1e-5);
  ASSERT_EQ(seen[0].top.size(), 5u);
  for (const auto& alt : seen[0].top) EXPECT_NEAR(alt.logprob, logprob(alt.id), 1e-5);
  for (size_t i = 0; i < seen.size(); ++i) {  // greedy: the chosen token is the most likely one
    EXPECT_EQ(seen[i].id, result.tokens[i]);
    EXPECT_EQ(seen[i].top.front().id, seen[i].id);
    EXPECT_FLOAT_EQ(seen[i].top.front().logprob, seen[i].logprob);
  }
}

TEST(Generate, RejectsABiasOutsideTheVocabularyBeforeAnyWork) {
  TinyModel tiny;
  GenerationRequest request;
  request.prompt = {1};
  request.sampling.logit_bias = {{static_cast<int32_t>(tiny.model.spec.vocab_size), 1.0f}};
  const GenerationResult result = generate(tiny.core, request);
  EXPECT_EQ(result.end.finish_reason, "error");
  EXPECT_EQ(result.end.error_category, ErrorCategory::kInvalidArgument);
  EXPECT_NE(result.end.error.find("logit_bias"), std::string::npos) << result.end.error;
  EXPECT_TRUE(result.tokens.empty());
}

}  // namespace
}  // namespace kettle
