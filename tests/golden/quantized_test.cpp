// Quantized checkpoints, end to end on the CPU: every tiny golden model
// converted by `kettle convert -q`'s library call (MLX affine layout) at several
// bits and group sizes, loaded, and run. The reference is the dense f32
// checkpoint of the values the codes stand for, written here by reading the
// codes bit by bit as MLX's layout defines them (independent of the codec
// under test): the quantized forward must give the same logits to the bit, and
// the same greedy tokens. How far quantization moves the logits from
// transformers' (the golden ones) is recorded, with a bound for 8 bits.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "model/quantize_checkpoint.h"
#include "support/safetensors_writer.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace kettle {
namespace {

using namespace golden;

float widen(const std::string& dtype, const std::vector<uint8_t>& bytes, size_t i) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return dtype == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
}

// The quantized folder as a dense f32 one: element j of a row is code j of the row's bit
// stream (read a bit at a time, LSB first) times its group's scale plus its bias.
void write_dequantized(const fs::path& quantized, const fs::path& out, int bits, int group) {
  fs::create_directories(out);
  auto tensors = test::read_safetensors((quantized / "model.safetensors").string());
  std::map<std::string, test::RawTensor> dense;
  for (auto& [name, t] : tensors) {
    if (t.dtype != "U32") {
      if (name.size() < 7 || (name.substr(name.size() - 7) != ".scales" && name.substr(name.size() - 7) != ".biases"))
        dense[name] = t;
      continue;
    }
    const std::string module = name.substr(0, name.size() - 7);
    const test::RawTensor& s = tensors.at(module + ".scales");
    const test::RawTensor& b = tensors.at(module + ".biases");
    const int64_t rows = t.shape[0], cols = t.shape[1] * 32 / bits, groups = cols / group;
    ASSERT_EQ(s.shape, (std::vector<int64_t>{rows, groups})) << module;
    test::RawTensor w{"F32", {rows, cols}, std::vector<uint8_t>(static_cast<size_t>(rows * cols * 4))};
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* stream = t.bytes.data() + r * t.shape[1] * 4;
      for (int64_t j = 0; j < cols; ++j) {
        uint32_t q = 0;
        for (int k = 0; k < bits; ++k) {
          const int64_t bit = j * bits + k;
          q |= static_cast<uint32_t>((stream[bit / 8] >> (bit % 8)) & 1) << k;
        }
        const size_t g = static_cast<size_t>(r * groups + j / group);
        const float v = widen(s.dtype, s.bytes, g) * static_cast<float>(q) + widen(b.dtype, b.bytes, g);
        std::memcpy(w.bytes.data() + (r * cols + j) * 4, &v, 4);
      }
    }
    dense[name] = std::move(w);
  }
  test::write_safetensors((out / "model.safetensors").string(), dense);
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(quantized / "config.json"));
  config.erase("quantization");
  config.erase("quantization_config");
  std::ofstream(out / "config.json") << config.dump(2);
  for (const char* file : {"generation_config.json"})
    if (fs::exists(quantized / file)) fs::copy_file(quantized / file, out / file);
}

std::vector<float> prompt_logits(const Model& model, const Golden& g) {
  auto backend = make_cpu_backend(2);
  StandaloneRunner standalone = make_standalone_runner(model, {backend.get()});
  KvCache kv = standalone->new_cache();
  std::vector<float> logits(g.logits.size(), NAN);
  standalone->forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, logits.data());
  return logits;
}

std::vector<int32_t> greedy(const Model& model, const Golden& g) {
  auto backend = make_cpu_backend(2);
  EngineCore core(model, nullptr, {backend.get()}, EngineOptions{});
  GenerationRequest request;
  request.prompt = g.prompt;
  request.max_tokens = static_cast<int64_t>(g.greedy.size());
  return generate(core, request).tokens;
}

bool is_moe(const std::string& name) {
  std::ifstream in(fs::path(model_dir(name)) / "config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  return c.contains("num_experts") || c.contains("num_local_experts");
}

struct Format {
  int bits, group;
};

class QuantizedGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedGoldenTest, ForwardEqualsTheDequantizedDenseModel) {
  const std::string name = GetParam();
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-quantized-" + case_label(name));
  fs::remove_all(work);
  fs::create_directories(work);
  if (is_moe(name)) {
    EXPECT_THROW(quantize_checkpoint(model_dir(name), (work / "q").string(), {}), Error);
    EXPECT_FALSE(fs::exists(work / "q"));
    return;
  }
  const Golden g = read_golden(case_dir(name));
  for (const Format f : {Format{8, 32}, Format{4, 64}, Format{3, 32}, Format{5, 32}, Format{6, 64}, Format{2, 32}}) {
    const std::string label = std::to_string(f.bits) + "-bit, groups of " + std::to_string(f.group);
    const fs::path q = work / ("q" + std::to_string(f.bits) + "g" + std::to_string(f.group));
    QuantizeOptions options;
    options.bits = f.bits;
    options.group_size = f.group;
    const QuantizeReport report = quantize_checkpoint(model_dir(name), q.string(), options);
    EXPECT_GT(report.quantized, 0) << label;
    write_dequantized(q, work / "dense", f.bits, f.group);
    const Model quantized = load_model(q.string()), reference = load_model((work / "dense").string());
    EXPECT_EQ(quantized.weights.layers[0].o.scheme, WeightScheme::kAffine);
    const std::vector<float> got = prompt_logits(quantized, g), want = prompt_logits(reference, g);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << label;
    EXPECT_EQ(greedy(quantized, g), greedy(reference, g)) << label;
    double worst = 0;
    for (int64_t p = 0; p < g.positions; ++p)
      worst = std::max(worst, relative_error(got.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab));
    RecordProperty("worst_relative_error_vs_transformers_" + std::to_string(f.bits) + "bit_g" + std::to_string(f.group),
                   std::to_string(worst));
    if (f.bits == 8) {
      EXPECT_LE(worst, 0.05) << label << ": 8-bit logits far from transformers'";
    }
    std::printf("%s %s: worst relative error of the prompt logits vs transformers %.4f\n", name.c_str(), label.c_str(),
                worst);
    fs::remove_all(q);
    fs::remove_all(work / "dense");
  }
  fs::remove_all(work);
}

// CUDA has no quantized kernels yet: the runner widens affine weights to bf16 as they load.
// The logits must then be the CPU's within the bf16 tolerance of the CUDA goldens.
TEST_P(QuantizedGoldenTest, CudaRunsTheWeightsWidenedToBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
  const std::string name = GetParam();
  if (is_moe(name)) GTEST_SKIP() << "quantized mixture-of-experts weights are refused (tested above)";
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-quantized-cuda-" + case_label(name));
  fs::remove_all(work);
  QuantizeOptions options;
  options.bits = 8;
  options.group_size = 32;
  quantize_checkpoint(model_dir(name), (work / "q").string(), options);
  const Model model = load_model((work / "q").string());
  const Golden g = read_golden(case_dir(name));
  const std::vector<float> cpu = prompt_logits(model, g);
  auto cuda = make_backend("cuda", 1);
  StandaloneRunner standalone = make_standalone_runner(model, {cuda.get()});
  KvCache kv = standalone->new_cache();
  std::vector<float> gpu(g.logits.size(), NAN);
  standalone->forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, gpu.data());
  for (int64_t p = 0; p < g.positions; ++p)
    EXPECT_LE(relative_error(gpu.data() + p * g.vocab, cpu.data() + p * g.vocab, g.vocab), 2e-2) << "position " << p;
  fs::remove_all(work);
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizedGoldenTest, ::testing::ValuesIn([] {
                           std::vector<std::string> tiny;
                           for (const std::string& n : case_names())
                             if (n.rfind("goldens/", 0) == 0) tiny.push_back(n);
                           return tiny;
                         }()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return case_label(info.param); });

}  // namespace
}  // namespace kettle
