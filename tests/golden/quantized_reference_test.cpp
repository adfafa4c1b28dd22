// Quantized checkpoints against Hugging Face transformers: the cases in
// tests/data/goldens-quantized were written by tools/quantized-goldens/make.py
// (its own numpy packers for MLX affine with mixed bits and quantized
// embeddings, MoE experts stacked as mlx-lm stacks them, AutoAWQ, AutoGPTQ and
// FP8 with block or channel scales, from the tiny golden models) with
// transformers' float32 logits and 24 greedy tokens on the weights those files
// stand for, made on the GPU box. kettle loads each file as published and must
// give those logits and tokens: on the CPU within the float goldens' bound, on
// CUDA within the bf16 bound with the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "engine/engine_core.h"
#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "util/error.h"

namespace kettle {
namespace {

using namespace golden;

std::vector<std::string> quantized_cases() {
  std::vector<std::string> names;
  const fs::path root = fs::path(KETTLE_TEST_DATA) / "goldens-quantized";
  if (fs::exists(root))
    for (auto& entry : fs::directory_iterator(root))
      if (fs::exists(entry.path() / "golden.json")) names.push_back("goldens-quantized/" + entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<float> prompt_logits(const Model& model, const Golden& g, Backend& backend) {
  StandaloneRunner standalone = make_standalone_runner(model, {&backend});
  KvCache kv = standalone->new_cache();
  std::vector<float> logits(g.logits.size(), NAN);
  standalone->forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, logits.data());
  return logits;
}

std::vector<int32_t> greedy(const Model& model, const Golden& g, Backend& backend) {
  EngineCore core(model, nullptr, {&backend}, EngineOptions{});
  GenerationRequest request;
  request.prompt = g.prompt;
  request.max_tokens = static_cast<int64_t>(g.greedy.size());
  return generate(core, request).tokens;
}

// transformers' logits at each greedy step (greedy_logits.f32: [tokens, vocab]).
std::vector<float> greedy_step_logits(const std::string& name, const Golden& g) {
  std::vector<float> steps(g.greedy.size() * static_cast<size_t>(g.vocab));
  std::ifstream in(case_dir(name) / "greedy_logits.f32", std::ios::binary);
  in.read(reinterpret_cast<char*>(steps.data()), static_cast<std::streamsize>(steps.size() * sizeof(float)));
  EXPECT_TRUE(in.good()) << "short greedy_logits.f32 in " << name;
  return steps;
}

// Greedy tokens as transformers' but where its own choice was a near tie: at the first
// token that differs, the one taken must be within 2 % of the step's logit range of
// transformers' best (bf16 activations may break such a tie either way); the tokens after
// it follow another context and are not compared.
void expect_same_greedy_up_to_ties(const std::vector<int32_t>& got, const Golden& g, const std::vector<float>& steps,
                                   const std::string& label) {
  ASSERT_EQ(got.size(), g.greedy.size()) << label;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == g.greedy[i]) continue;
    const float* step = steps.data() + i * static_cast<size_t>(g.vocab);
    const auto [lo, hi] = std::minmax_element(step, step + g.vocab);
    const float margin = step[g.greedy[i]] - step[got[i]];
    EXPECT_LE(margin, 0.02f * (*hi - *lo)) << label << ": token " << i << " is " << got[i] << ", transformers' "
                                           << g.greedy[i] << " leads by " << margin;
    ::testing::Test::RecordProperty("greedy_tie_broken_at_" + label, static_cast<int>(i));
    return;
  }
}

class QuantizedReferenceTest : public ::testing::TestWithParam<std::string> {};

// At least one case of each layout the tool writes is here (a missing folder would
// otherwise leave nothing to check).
TEST(QuantizedReferenceCases, EveryLayoutHasCases) {
  const std::vector<std::string> cases = quantized_cases();
  for (const char* layout : {"-mlx-mixed-g64", "-mlx-3bit-g32", "-awq-g32", "-gptq-", "-fp8-block", "-fp8-channel"})
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [&](const std::string& c) { return c.find(layout) != std::string::npos; }))
        << layout;
}

// The float goldens' bound, 1e-4 per position (measured: at most 2e-5, on the GPU box's CPU
// and this one, 4-bit weights through AVX-512 BF16 included), and the same greedy tokens.
TEST_P(QuantizedReferenceTest, CpuMatchesTransformers) {
  const Golden g = read_golden(case_dir(GetParam()));
  const Model model = load_model(model_dir(GetParam()));
  auto cpu = make_cpu_backend(2);
  const std::vector<float> logits = prompt_logits(model, g, *cpu);
  double worst = 0;
  for (int64_t p = 0; p < g.positions; ++p) {
    const double err = relative_error(logits.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4) << "position " << p;
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
  EXPECT_EQ(greedy(model, g, *cpu), g.greedy);
  EXPECT_EQ(greedy_step_logits(GetParam(), g).size(), g.greedy.size() * static_cast<size_t>(g.vocab));
}

// CUDA: 4/8-bit affine weights through its kernels (f32-accurate), others widened to bf16 at
// load, activations rounded to bf16 in its GEMMs and the KV cache f16: logits within the
// bf16 bound, greedy tokens the same but for near ties. A MoE's routers and experts are
// widened to bf16 for CUDA's MoE kernels, which flips a tiny random MoE's near-tied
// routing at some positions: there the median position is held to the bound and the
// tokens are not compared. FP8 weights run both ways: widened to bf16 (--fp8-compute
// bf16 or auto, the bounds above), and where the GPU runs them on its FP8 tensor cores
// (--fp8-compute fp8, on Hopper), with activations quantized to FP8 per token as transformers' FP8Linear does:
// transformers' logits here are of the dequantized weights times f32 activations, so the
// bound is e4m3's own rounding (3 mantissa bits: up to 2^-4 of each activation), 0.08.
TEST_P(QuantizedReferenceTest, CudaMatchesTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
  const Golden g = read_golden(case_dir(GetParam()));
  const std::vector<float> steps = greedy_step_logits(GetParam(), g);
  const Model model = load_model(model_dir(GetParam()));
  const bool moe = model.spec.n_experts > 0, fp8 = model.spec.quant.method == QuantMethod::kFp8;
  for (Fp8Compute mode : {Fp8Compute::kBf16, Fp8Compute::kFp8}) {
    if (mode == Fp8Compute::kFp8 && !fp8) continue;
    for (bool invariant : {false, true}) {
      BackendOptions options;
      options.device = "cuda";
      options.batch_invariant = invariant;
      options.fp8 = mode;
      std::unique_ptr<Backend> cuda;
      try {
        cuda = make_backend(options);
      } catch (const Error&) {  // no FP8 GEMMs on this GPU: the first pass covered it
        continue;
      }
      const bool fp8_products = mode == Fp8Compute::kFp8 && cuda->can_run(model.weights.layers[0].o);
      if (mode == Fp8Compute::kFp8 && !fp8_products) continue;  // widened here: the first pass covered it
      const std::string label = std::string(invariant ? "invariant" : "fastest") + (fp8_products ? ", fp8 products" : "");
      const double bound = fp8_products ? 0.08 : 2e-2;
      const std::vector<float> logits = prompt_logits(model, g, *cuda);
      std::vector<double> errors;
      for (int64_t p = 0; p < g.positions; ++p)
        errors.push_back(relative_error(logits.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab));
      if (moe) {
        std::nth_element(errors.begin(), errors.begin() + errors.size() / 2, errors.end());
        EXPECT_LE(errors[errors.size() / 2], bound) << label << ": the median position";
        continue;
      }
      for (size_t p = 0; p < errors.size(); ++p) EXPECT_LE(errors[p], bound) << "position " << p << ", " << label;
      const std::vector<int32_t> tokens = greedy(model, g, *cuda);
      if (!fp8_products) {
        expect_same_greedy_up_to_ties(tokens, g, steps, label);
        continue;
      }
      // Other activations than transformers' reference took: the tokens are reported.
      size_t same = 0;
      while (same < tokens.size() && same < g.greedy.size() && tokens[same] == g.greedy[same]) ++same;
      std::printf("%s (%s): worst position %.4f; greedy tokens as transformers' for the first %zu of %zu\n",
                  GetParam().c_str(), label.c_str(), *std::max_element(errors.begin(), errors.end()), same,
                  g.greedy.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizedReferenceTest, ::testing::ValuesIn(quantized_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return case_label(info.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(QuantizedReferenceTest);

}  // namespace
}  // namespace kettle
