// Parity with Hugging Face transformers: for every case under
// tests/data/goldens (tiny random models, model/ inside the case) and
// tests/data/goldens-demo (the bundled demo models under models/), the f32 CPU
// forward reproduces the reference logits of every prompt position (relative
// error ≤ 1e-4 per position) and the 24 greedy tokens exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "golden/batch_equivalence.h"
#include "golden/golden_cases.h"

namespace kettle {
namespace {

using namespace golden;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, PromptLogitsMatchTransformers) {
  const fs::path dir = case_dir(GetParam());
  Golden g = read_golden(dir);
  Model model = load_model(model_dir(GetParam()));
  ASSERT_EQ(model.spec.vocab_size, g.vocab);
  ASSERT_EQ(static_cast<int64_t>(g.prompt.size()), g.positions);
  for (int threads : {1, 2}) {
    auto backend = make_cpu_backend(threads);
    StandaloneRunner standalone = make_standalone_runner(model, {backend.get()});
    ModelRunner& runner = *standalone;
    KvCache kv = runner.new_cache();
    std::vector<float> logits(g.logits.size(), NAN);
    runner.forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, logits.data());
    double worst = 0;
    for (int64_t p = 0; p < g.positions; ++p) {
      double err = relative_error(logits.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab);
      EXPECT_LE(err, 1e-4) << "position " << p << " with " << threads << " threads";
      worst = std::max(worst, err);
    }
    RecordProperty("worst_relative_error_threads_" + std::to_string(threads), std::to_string(worst));
  }
}

TEST_P(GoldenTest, GreedyTokensMatchTransformers) {
  const fs::path dir = case_dir(GetParam());
  Golden g = read_golden(dir);
  Model model = load_model(model_dir(GetParam()));
  auto backend = make_cpu_backend(2);
  EngineCore core(model, nullptr, {backend.get()}, EngineOptions{});
  GenerationRequest request;
  request.prompt = g.prompt;
  request.max_tokens = static_cast<int64_t>(g.greedy.size());
  GenerationResult result = generate(core, request);
  EXPECT_EQ(result.tokens, g.greedy);
}

// Decoding one token at a time must give the same logits as one prefill over the
// same tokens: the KV cache path and the batched path agree.
TEST_P(GoldenTest, IncrementalDecodeMatchesPrefill) {
  const fs::path dir = case_dir(GetParam());
  Golden g = read_golden(dir);
  Model model = load_model(model_dir(GetParam()));
  auto backend = make_cpu_backend(2);
  StandaloneRunner standalone = make_standalone_runner(model, {backend.get()});
  ModelRunner& runner = *standalone;
  KvCache kv = runner.new_cache();
  const int64_t split = g.positions / 2;
  std::vector<float> logits(static_cast<size_t>(g.vocab));
  runner.forward(g.prompt.data(), split, kv, LogitsFor::kLastToken, logits.data());
  for (int64_t p = split; p < g.positions; ++p) {
    runner.forward(&g.prompt[static_cast<size_t>(p)], 1, kv, LogitsFor::kLastToken, logits.data());
    EXPECT_LE(relative_error(logits.data(), g.logits.data() + p * g.vocab, g.vocab), 1e-4) << "position " << p;
  }
}

TEST_P(GoldenTest, ContinuousBatchingChangesNoToken) {
  auto backend = make_cpu_backend(2);
  expect_batching_changes_no_token(*backend, GetParam());
}

TEST_P(GoldenTest, SpeculationChangesNoToken) {
  auto backend = make_cpu_backend(2);
  expect_speculation_changes_no_token(*backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return case_label(info.param); });

}  // namespace
}  // namespace kettle
