// The golden cases on the CUDA backend (bf16 weights, f32 activations): the
// 24 greedy tokens exactly, prompt logits within 2e-2 relative error per
// position, and single-token decode (the recorded CUDA-graph step) agreeing
// with the reference too. Skipped where no CUDA device is present; label cuda.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "golden/batch_equivalence.h"
#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/model_runner.h"

namespace kettle {
namespace {

using namespace golden;

constexpr double kBf16LogitTolerance = 2e-2;

class GoldenCudaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
    BackendOptions fast;  // the fastest one-stream decode; the batch-invariant one below
    fast.device = "cuda";
    fast.batch_invariant = false;
    backend_ = make_backend(fast);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(GoldenCudaTest, PromptLogitsMatchTransformers) {
  Golden g = read_golden(case_dir(GetParam()));
  Model model = load_model(model_dir(GetParam()));
  StandaloneRunner standalone = make_standalone_runner(model, {backend_.get()});
  ModelRunner& runner = *standalone;
  KvCache kv = runner.new_cache();
  std::vector<float> logits(g.logits.size(), NAN);
  runner.forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, logits.data());
  double worst = 0;
  for (int64_t p = 0; p < g.positions; ++p) {
    double err = relative_error(logits.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab);
    EXPECT_LE(err, kBf16LogitTolerance) << "position " << p;
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
  std::printf("[ golden ] %s worst prompt-logit relative error %.2e\n", GetParam().c_str(), worst);
}

TEST_P(GoldenCudaTest, GreedyTokensMatchTransformers) {
  Golden g = read_golden(case_dir(GetParam()));
  Model model = load_model(model_dir(GetParam()));
  EngineCore core(model, nullptr, {backend_.get()}, EngineOptions{});
  GenerationRequest request;
  request.prompt = g.prompt;
  request.max_tokens = static_cast<int64_t>(g.greedy.size());
  for (int run = 0; run < 2; ++run) {  // the second run replays the recorded decode steps
    GenerationResult result = generate(core, request);
    EXPECT_EQ(result.tokens, g.greedy) << "run " << run;
  }
}

TEST_P(GoldenCudaTest, IncrementalDecodeMatchesReference) {
  Golden g = read_golden(case_dir(GetParam()));
  Model model = load_model(model_dir(GetParam()));
  StandaloneRunner standalone = make_standalone_runner(model, {backend_.get()});
  ModelRunner& runner = *standalone;
  KvCache kv = runner.new_cache();
  const int64_t split = g.positions / 2;
  std::vector<float> logits(static_cast<size_t>(g.vocab));
  runner.forward(g.prompt.data(), split, kv, LogitsFor::kLastToken, logits.data());
  for (int64_t p = split; p < g.positions; ++p) {
    std::fill(logits.begin(), logits.end(), NAN);
    runner.forward(&g.prompt[static_cast<size_t>(p)], 1, kv, LogitsFor::kLastToken, logits.data());
    EXPECT_LE(relative_error(logits.data(), g.logits.data() + p * g.vocab, g.vocab), kBf16LogitTolerance)
        << "position " << p;
  }
}

TEST_P(GoldenCudaTest, ContinuousBatchingChangesNoToken) { expect_batching_changes_no_token(*backend_, GetParam()); }

// The same with decodes through the batch-invariant plan (--batch-invariant).
TEST_P(GoldenCudaTest, ContinuousBatchingChangesNoTokenBatchInvariant) {
  auto invariant = make_backend("cuda", 1);
  expect_batching_changes_no_token(*invariant, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenCudaTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return case_label(info.param); });

}  // namespace
}  // namespace kettle
