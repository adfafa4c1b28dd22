// The golden cases on the CUDA backend (bf16 weights, f32 activations): the
// 24 greedy tokens exactly, prompt logits within 2e-2 relative error per
// position, and single-token decode (the recorded CUDA-graph step) agreeing
// with the reference too. Skipped where no CUDA device is present; label cuda.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "golden/batch_equivalence.h"
#include "golden/golden_cases.h"
#include "kv/kv_quant.h"
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

// Speculation's verify rows are decode rows: the same tokens with and without drafts
// (the batch-invariant plan, as serve runs by default).
TEST_P(GoldenCudaTest, SpeculationChangesNoToken) {
  auto invariant = make_backend("cuda", 1);
  expect_speculation_changes_no_token(*invariant, GetParam());
}

// And under each --kv-quant mode (the batch-invariant plan, as serve runs by default).
TEST_P(GoldenCudaTest, ContinuousBatchingChangesNoTokenUnderEachKvQuant) {
  auto invariant = make_backend("cuda", 1);
  for (const char* mode : {"8", "4", "fp8", "turbo"}) {
    SCOPED_TRACE(std::string("--kv-quant ") + mode);
    expect_batching_changes_no_token(*invariant, GetParam(), parse_kv_quant(mode));
  }
}

// A long prompt (8,192 tokens, past the tiny models' 4,096 positions: the limit is
// raised, the weights are the golden model's) through the tensor-core prompt attention,
// whole and in uneven chunks, against the CPU backend's logits for the same model.
TEST_P(GoldenCudaTest, LongPromptLogitsMatchTheCpuWholeAndChunked) {
  constexpr int64_t kLength = 8192;
  Model model = load_model(model_dir(GetParam()));
  model.spec.max_position_embeddings = std::max<int64_t>(model.spec.max_position_embeddings, 2 * kLength);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(model.spec.vocab_size - 1));
  std::vector<int32_t> prompt(kLength);
  for (auto& t : prompt) t = id(rng);
  const size_t rows = static_cast<size_t>(kLength * model.spec.vocab_size);
  const auto logits_of = [&](Backend& backend, int64_t chunk) {
    StandaloneRunner standalone = make_standalone_runner(model, {&backend});
    KvCache kv = standalone->new_cache();
    std::vector<float> logits(rows, NAN);
    for (int64_t from = 0; from < kLength; from += chunk) {
      const int64_t n = std::min(chunk, kLength - from);
      standalone->forward(prompt.data() + from, n, kv, LogitsFor::kAllTokens,
                          logits.data() + from * model.spec.vocab_size);
    }
    return logits;
  };
  auto cpu = make_backend("cpu", 0);
  const std::vector<float> reference = logits_of(*cpu, kLength);
  // A mixture of experts routes by a discrete top-k: where two experts' router logits tie
  // to within the backends' rounding, the two pick different experts and that position's
  // logits part ways (a flip, not drift). Among 8,192 random tokens a few such ties occur,
  // so MoE models may have up to 0.2 % of positions past the tolerance; dense models none.
  const int64_t allowed = model.spec.n_experts > 0 ? kLength / 500 : 0;
  std::vector<float> first;
  for (int64_t chunk : {kLength, int64_t{1000}, int64_t{333}}) {
    const std::vector<float> got = logits_of(*backend_, chunk);
    std::vector<double> errors;
    for (int64_t p = 0; p < kLength; ++p) {
      const double err = relative_error(got.data() + p * model.spec.vocab_size,
                                        reference.data() + p * model.spec.vocab_size, model.spec.vocab_size);
      errors.push_back(std::isnan(err) ? INFINITY : err);
    }
    const auto past = std::count_if(errors.begin(), errors.end(), [](double e) { return e > kBf16LogitTolerance; });
    std::sort(errors.begin(), errors.end());
    EXPECT_LE(past, allowed) << "chunks of " << chunk;
    EXPECT_LE(errors[errors.size() / 2], kBf16LogitTolerance / 4) << "chunks of " << chunk << ": the median";
    std::printf("[ golden ] %s %lld-token prompt in chunks of %lld vs CPU: median %.2e, worst %.2e, %lld past %.0e\n",
                GetParam().c_str(), static_cast<long long>(kLength), static_cast<long long>(chunk),
                errors[errors.size() / 2], errors.back(), static_cast<long long>(past), kBf16LogitTolerance);
    // A prompt token's logits do not depend on the chunk it was in: the same bits.
    if (first.empty())
      first = got;
    else
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0) << "chunks of " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenCudaTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return case_label(info.param); });

}  // namespace
}  // namespace kettle
