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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "engine/engine_core.h"
#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "model/quantize_checkpoint.h"
#include "model/rotate_weights.h"
#include "support/e4m3.h"
#include "support/safetensors_writer.h"
#include "tensor/affine_quant.h"
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

// Which quantized modules write_dequantized widens, and to what: all of them to f32 (the
// dense twin), or some to bf16 with the rest left quantized (what a backend that widens
// them at load computes with).
struct Widening {
  std::function<bool(const std::string& module)> select = [](const std::string&) { return true; };
  bool bf16 = false;
};

// Routers (`<block>.gate`) and stacked experts to bf16, as CUDA widens them.
Widening bf16_experts() {
  return {[](const std::string& m) {
            return m.find(".switch_mlp.") != std::string::npos || (m.size() > 5 && m.substr(m.size() - 5) == ".gate");
          },
          true};
}

uint16_t bf16_nearest_even(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The quantized folder with its modules dense: element j of a row is code j of the row's bit
// stream (read a bit at a time, LSB first) times its group's scale plus its bias. Each
// module's bits and group size are config.json's (its per-module entry, else the default);
// stacked experts [n, out, in · bits / 32] become [n, out, in].
void write_dequantized(const fs::path& quantized, const fs::path& out, const Widening& widening = {}) {
  fs::create_directories(out);
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(quantized / "config.json"));
  const nlohmann::ordered_json& q = config.at("quantization");
  auto tensors = test::read_safetensors((quantized / "model.safetensors").string());
  std::map<std::string, test::RawTensor> dense;
  const auto module_of = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (auto& [name, t] : tensors) {
    const std::string module = module_of(name);
    if (tensors.count(module + ".scales") == 0 || !widening.select(module)) {
      dense[name] = t;
      continue;
    }
    if (t.dtype != "U32") {  // its scales and biases fold into the dense weight; a bias stays
      if (name != module + ".scales" && name != module + ".biases") dense[name] = t;
      continue;
    }
    const nlohmann::ordered_json& own = q.contains(module) ? q.at(module) : q;
    const int bits = own.at("bits").get<int>(), group = own.at("group_size").get<int>();
    const test::RawTensor& s = tensors.at(module + ".scales");
    const test::RawTensor& b = tensors.at(module + ".biases");
    const int64_t words = t.shape.back(), cols = words * 32 / bits, groups = cols / group;
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= t.shape[d];
    std::vector<int64_t> shape = t.shape, scale_shape = t.shape;
    shape.back() = cols;
    scale_shape.back() = groups;
    EXPECT_EQ(s.shape, scale_shape) << module;
    const size_t width = widening.bf16 ? 2 : 4;
    test::RawTensor w{widening.bf16 ? "BF16" : "F32", shape, std::vector<uint8_t>(static_cast<size_t>(rows * cols) * width)};
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* stream = t.bytes.data() + r * words * 4;
      for (int64_t j = 0; j < cols; ++j) {
        uint32_t code = 0;
        for (int k = 0; k < bits; ++k) {
          const int64_t bit = j * bits + k;
          code |= static_cast<uint32_t>((stream[bit / 8] >> (bit % 8)) & 1) << k;
        }
        const size_t gi = static_cast<size_t>(r * groups + j / group);
        const float v = widen(s.dtype, s.bytes, gi) * static_cast<float>(code) + widen(b.dtype, b.bytes, gi);
        const uint16_t h = bf16_nearest_even(v);
        std::memcpy(w.bytes.data() + (r * cols + j) * width, widening.bf16 ? static_cast<const void*>(&h) : &v, width);
      }
    }
    dense[name] = std::move(w);
  }
  test::write_safetensors((out / "model.safetensors").string(), dense);
  bool all = true;
  for (const auto& [name, t] : dense) all &= t.dtype != "U32";
  if (all) {
    config.erase("quantization");
    config.erase("quantization_config");
  }
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

// A quantized model's logits against its dequantized dense twin's: the same bits, except
// where 4-bit weights take the CPU's AVX-512 BF16 kernel (x as bf16 hi + lo, products
// exact, sums in another order): there within 1e-4 relative error per position.
void expect_same_logits(const std::vector<float>& got, const std::vector<float>& want, int bits, const Golden& g,
                        const std::string& label) {
  if (bits == 4 && cpu_features().avx512_bf16 && best_cpu_isa() == CpuIsa::kAvx512) {
    for (int64_t p = 0; p < g.positions; ++p)
      EXPECT_LE(relative_error(got.data() + p * g.vocab, want.data() + p * g.vocab, g.vocab), 1e-4)
          << label << ", position " << p;
    return;
  }
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << label;
}

// A mixture of experts converted as mlx-lm writes one: every MoE layer's experts stacked
// under switch_mlp (no per-expert tensors left), quantized at the run's bits, the router
// at 8 bits (a per-module entry when the run's are fewer).
void expect_quantized_experts(const Model& model, const fs::path& folder, int bits, int group) {
  const auto tensors = test::read_safetensors((folder / "model.safetensors").string());
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(folder / "config.json"));
  int moe_layers = 0;
  for (const auto& [name, t] : tensors) EXPECT_EQ(name.find(".experts."), std::string::npos) << name;
  for (size_t i = 0; i < model.weights.layers.size(); ++i) {
    const LayerWeights& l = model.weights.layers[i];
    if (l.experts.empty()) continue;
    ++moe_layers;
    EXPECT_EQ(l.router.scheme, WeightScheme::kAffine) << "layer " << i;
    EXPECT_EQ(l.router.affine.bits, 8) << "layer " << i;
    for (const ExpertWeights& e : l.experts)
      for (const Linear* p : {&e.gate, &e.up, &e.down}) {
        if (p->in_features() % group != 0) continue;  // a width the groups do not divide stays float
        EXPECT_EQ(p->scheme, WeightScheme::kAffine) << "layer " << i;
        EXPECT_EQ(p->affine.bits, bits) << "layer " << i;
      }
    bool stacked = false;
    for (const auto& [name, t] : tensors)
      stacked |= name.find("layers." + std::to_string(i) + ".") != std::string::npos &&
                 name.find(".switch_mlp.gate_proj.weight") != std::string::npos && t.shape.size() == 3;
    EXPECT_TRUE(stacked) << "layer " << i << ": no stacked switch_mlp.gate_proj";
  }
  EXPECT_GT(moe_layers, 0);
  if (bits < 8) {
    EXPECT_TRUE(config["quantization"].contains("model.layers.0.mlp.gate") ||
                config["quantization"].contains("model.layers.0.block_sparse_moe.gate"))
        << config["quantization"].dump();
  }
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
  const Golden g = read_golden(case_dir(name));
  for (const Format f : {Format{8, 32}, Format{4, 64}, Format{3, 32}, Format{5, 32}, Format{6, 64}, Format{2, 32}}) {
    const std::string label = std::to_string(f.bits) + "-bit, groups of " + std::to_string(f.group);
    const fs::path q = work / ("q" + std::to_string(f.bits) + "g" + std::to_string(f.group));
    QuantizeOptions options;
    options.bits = f.bits;
    options.group_size = f.group;
    const QuantizeReport report = quantize_checkpoint(model_dir(name), q.string(), options);
    EXPECT_GT(report.quantized, 0) << label;
    write_dequantized(q, work / "dense");
    const Model quantized = load_model(q.string()), reference = load_model((work / "dense").string());
    EXPECT_EQ(quantized.weights.layers[0].o.scheme, WeightScheme::kAffine);
    if (is_moe(name)) expect_quantized_experts(quantized, q, f.bits, f.group);
    if (is_moe(name) && f.bits == 8) {  // the CUDA test's reference: experts and routers widened to bf16
      write_dequantized(q, work / "bf16-experts", bf16_experts());
      const Model widened = load_model((work / "bf16-experts").string());
      EXPECT_EQ(widened.weights.layers[0].experts[0].gate.weight.dtype, DType::kBF16);
      EXPECT_EQ(widened.weights.layers[0].router.weight.dtype, DType::kBF16);
      EXPECT_EQ(widened.weights.layers[0].o.scheme, WeightScheme::kAffine);
      // Each widened value is the bf16 rounding of the one the quantized model computes with.
      const Linear& packed = quantized.weights.layers[0].experts[1].up;
      const Tensor& bf16 = widened.weights.layers[0].experts[1].up.weight;
      std::vector<float> row(static_cast<size_t>(packed.in_features()));
      affine_dequantize(affine_row(packed.weight, packed.affine.scales, packed.affine.biases, 3), packed.affine.bits,
                        packed.affine.group_size, 0, packed.in_features(), row.data());
      for (int64_t c = 0; c < packed.in_features(); ++c)
        EXPECT_EQ(static_cast<const uint16_t*>(bf16.data)[3 * packed.in_features() + c], f32_to_bf16(row[static_cast<size_t>(c)]));
      fs::remove_all(work / "bf16-experts");
    }
    const std::vector<float> got = prompt_logits(quantized, g), want = prompt_logits(reference, g);
    expect_same_logits(got, want, f.bits, g, label);
    EXPECT_EQ(greedy(quantized, g), greedy(reference, g)) << label;
    double worst = 0;
    for (int64_t p = 0; p < g.positions; ++p)
      worst = std::max(worst, relative_error(got.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab));
    RecordProperty("worst_relative_error_vs_transformers_" + std::to_string(f.bits) + "bit_g" + std::to_string(f.group),
                   std::to_string(worst));
    // A tiny random MoE routes on near-equal router logits: any perturbation of the weights
    // (8-bit or FP8 alike) flips some tokens' experts, so its distance from transformers'
    // logits measures those flips, not the codec (recorded, not bounded).
    if (f.bits == 8 && !is_moe(name)) {
      EXPECT_LE(worst, 0.05) << label << ": 8-bit logits far from transformers'";
    }
    std::printf("%s %s: worst relative error of the prompt logits vs transformers %.4f\n", name.c_str(), label.c_str(),
                worst);
    fs::remove_all(q);
    fs::remove_all(work / "dense");
  }
  fs::remove_all(work);
}

// A MoE golden model rewritten in transformers 5's layout (each layer's experts fused into
// experts.gate_up_proj [n, 2 inter, hidden] and experts.down_proj [n, hidden, inter]):
// converting it writes the very bytes converting the per-expert source does.
void write_fused_experts(const std::string& name, const fs::path& out) {
  fs::create_directories(out);
  const fs::path src = fs::path(model_dir(name));
  const bool mixtral = name.find("mixtral") != std::string::npos;
  const std::string gate = mixtral ? "w1" : "gate_proj", up = mixtral ? "w3" : "up_proj", down = mixtral ? "w2" : "down_proj";
  auto tensors = test::read_safetensors((src / "model.safetensors").string());
  std::map<std::string, test::RawTensor> fused;
  std::map<std::string, int> experts;  // block → experts seen
  for (auto& [tname, t] : tensors) {
    const size_t at = tname.find(".experts.");
    if (at == std::string::npos) {
      fused[tname] = t;
      continue;
    }
    const std::string block = tname.substr(0, at);
    const int e = std::stoi(tname.substr(at + 9));
    experts[block] = std::max(experts[block], e + 1);
  }
  for (const auto& [block, n] : experts) {
    test::RawTensor gate_up, downs;
    for (int e = 0; e < n; ++e) {
      const std::string p = block + ".experts." + std::to_string(e) + ".";
      for (const std::string* part : {&gate, &up}) {
        const test::RawTensor& t = tensors.at(p + *part + ".weight");
        gate_up.dtype = t.dtype;
        gate_up.bytes.insert(gate_up.bytes.end(), t.bytes.begin(), t.bytes.end());
        gate_up.shape = {n, 2 * t.shape[0], t.shape[1]};
      }
      const test::RawTensor& d = tensors.at(p + down + ".weight");
      downs.dtype = d.dtype;
      downs.bytes.insert(downs.bytes.end(), d.bytes.begin(), d.bytes.end());
      downs.shape = {n, d.shape[0], d.shape[1]};
    }
    fused[block + ".experts.gate_up_proj"] = std::move(gate_up);
    fused[block + ".experts.down_proj"] = std::move(downs);
  }
  test::write_safetensors((out / "model.safetensors").string(), fused);
  for (const auto& entry : fs::directory_iterator(src))
    if (entry.path().extension() != ".safetensors") fs::copy(entry.path(), out / entry.path().filename());
}

TEST_P(QuantizedGoldenTest, FusedExpertsConvertAsPerExpertOnes) {
  const std::string name = GetParam();
  if (!is_moe(name)) GTEST_SKIP() << "not a mixture of experts";
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-fused-experts-" + case_label(name));
  fs::remove_all(work);
  write_fused_experts(name, work / "fused");
  QuantizeOptions options;
  options.bits = 4;
  options.group_size = 32;
  quantize_checkpoint(model_dir(name), (work / "a").string(), options);
  quantize_checkpoint((work / "fused").string(), (work / "b").string(), options);
  const auto a = test::read_safetensors((work / "a" / "model.safetensors").string());
  const auto b = test::read_safetensors((work / "b" / "model.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [tname, t] : a) {
    ASSERT_EQ(b.count(tname), 1u) << tname;
    EXPECT_EQ(t.shape, b.at(tname).shape) << tname;
    EXPECT_TRUE(t.bytes == b.at(tname).bytes) << tname;
  }
  // The fused float source loads and runs as the per-expert one does.
  const Golden g = read_golden(case_dir(name));
  const std::vector<float> fused = prompt_logits(load_model((work / "fused").string()), g);
  const std::vector<float> split = prompt_logits(load_model(model_dir(name)), g);
  EXPECT_EQ(0, std::memcmp(fused.data(), split.data(), fused.size() * sizeof(float)));
  fs::remove_all(work);
}

// ---- AWQ and GPTQ: zero-point 4/8-bit checkpoints, repacked at load ----

bool is_projection(const std::string& name) {
  if (name.find(".layers.") == std::string::npos || name.size() < 12) return false;
  return name.substr(name.size() - 12) == "_proj.weight";
}

// A golden model with its projections written as AutoAWQ (GEMM packing) or AutoGPTQ (the
// original format: zero points stored minus one, trivial g_idx) write them, from a
// min/max rounding made here; and beside it the dense f32 checkpoint of what those codes
// stand for, s · (q − z).
void write_zero_point(const std::string& name, const fs::path& out, const fs::path& dense, bool awq, int bits,
                      int group) {
  fs::create_directories(out);
  fs::create_directories(dense);
  const fs::path src = fs::path(model_dir(name));
  auto tensors = test::read_safetensors((src / "model.safetensors").string());
  std::map<std::string, test::RawTensor> packed, reference;
  const uint32_t maxq = (1u << bits) - 1, per_word = 32 / bits;
  static constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (auto& [tname, t] : tensors) {
    if (!is_projection(tname) || t.shape[1] % group != 0) {  // AutoAWQ/AutoGPTQ leave such a module float
      packed[tname] = reference[tname] = t;
      continue;
    }
    const std::string module = tname.substr(0, tname.size() - 7);
    const int64_t rows = t.shape[0], cols = t.shape[1], groups = cols / group;  // out, in
    std::vector<uint32_t> q(static_cast<size_t>(rows * cols)), z(static_cast<size_t>(rows * groups));
    std::vector<uint16_t> s(static_cast<size_t>(rows * groups));
    test::RawTensor deq{"F32", {rows, cols}, std::vector<uint8_t>(static_cast<size_t>(rows * cols * 4))};
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t g = 0; g < groups; ++g) {
        float lo = 0, hi = 0;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          lo = std::min(lo, widen(t.dtype, t.bytes, static_cast<size_t>(o * cols + i)));
          hi = std::max(hi, widen(t.dtype, t.bytes, static_cast<size_t>(o * cols + i)));
        }
        const uint16_t scale_bits = f32_to_f16(std::max((hi - lo) / static_cast<float>(maxq), 1e-4f));
        const float scale = f16_to_f32(scale_bits);
        const auto zero = static_cast<uint32_t>(std::clamp(std::nearbyint(-lo / scale), 1.0f, static_cast<float>(maxq)));
        s[static_cast<size_t>(g * rows + o)] = scale_bits;  // scales are [groups, out]
        z[static_cast<size_t>(g * rows + o)] = zero;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          const float w = widen(t.dtype, t.bytes, static_cast<size_t>(o * cols + i));
          const auto code = static_cast<uint32_t>(
              std::clamp(std::nearbyint(w / scale) + static_cast<float>(zero), 0.0f, static_cast<float>(maxq)));
          q[static_cast<size_t>(i * rows + o)] = code;  // codes as [in, out], as these formats index them
          const float v = scale * (static_cast<float>(code) - static_cast<float>(zero));
          std::memcpy(deq.bytes.data() + (o * cols + i) * 4, &v, 4);
        }
      }
    const auto words = [](std::vector<int64_t> shape, const std::vector<uint32_t>& w) {
      test::RawTensor r{"I32", std::move(shape), std::vector<uint8_t>(w.size() * 4)};
      std::memcpy(r.bytes.data(), w.data(), r.bytes.size());
      return r;
    };
    if (awq) {  // qweight [in, out/8], qzeros [groups, out/8]: output 8c + order[n] in nibble n
      std::vector<uint32_t> qw(static_cast<size_t>(cols * rows / 8), 0), qz(static_cast<size_t>(groups * rows / 8), 0);
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t c = 0; c < rows / 8; ++c)
          for (int n = 0; n < 8; ++n) qw[static_cast<size_t>(i * rows / 8 + c)] |= q[static_cast<size_t>(i * rows + 8 * c + kAwqOrder[n])] << (4 * n);
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t c = 0; c < rows / 8; ++c)
          for (int n = 0; n < 8; ++n) qz[static_cast<size_t>(g * rows / 8 + c)] |= z[static_cast<size_t>(g * rows + 8 * c + kAwqOrder[n])] << (4 * n);
      packed[module + ".qweight"] = words({cols, rows / 8}, qw);
      packed[module + ".qzeros"] = words({groups, rows / 8}, qz);
    } else {  // qweight [in/per_word, out] along the inputs; qzeros [groups, out/per_word] holding z − 1
      std::vector<uint32_t> qw(static_cast<size_t>(cols / per_word * rows), 0);
      std::vector<uint32_t> qz(static_cast<size_t>(groups * rows / per_word), 0);
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t o = 0; o < rows; ++o)
          qw[static_cast<size_t>((i / per_word) * rows + o)] |= q[static_cast<size_t>(i * rows + o)] << (bits * (i % per_word));
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t o = 0; o < rows; ++o)
          qz[static_cast<size_t>(g * rows / per_word + o / per_word)] |= (z[static_cast<size_t>(g * rows + o)] - 1) << (bits * (o % per_word));
      std::vector<uint32_t> g_idx(static_cast<size_t>(cols));
      for (int64_t i = 0; i < cols; ++i) g_idx[static_cast<size_t>(i)] = static_cast<uint32_t>(i / group);
      packed[module + ".qweight"] = words({cols / per_word, rows}, qw);
      packed[module + ".qzeros"] = words({groups, rows / per_word}, qz);
      packed[module + ".g_idx"] = words({cols}, g_idx);
    }
    test::RawTensor scales{"F16", {groups, rows}, std::vector<uint8_t>(s.size() * 2)};
    std::memcpy(scales.bytes.data(), s.data(), scales.bytes.size());
    packed[module + ".scales"] = scales;
    reference[tname] = std::move(deq);
  }
  test::write_safetensors((out / "model.safetensors").string(), packed);
  test::write_safetensors((dense / "model.safetensors").string(), reference);
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(src / "config.json"));
  std::ofstream(dense / "config.json") << config.dump(2);
  config["quantization_config"] =
      awq ? nlohmann::ordered_json{{"quant_method", "awq"}, {"bits", bits}, {"group_size", group}, {"zero_point", true},
                                   {"version", "gemm"}}
          : nlohmann::ordered_json{{"quant_method", "gptq"}, {"bits", bits}, {"group_size", group}, {"desc_act", false},
                                   {"sym", false}, {"checkpoint_format", "gptq"}};
  std::ofstream(out / "config.json") << config.dump(2);
}

TEST_P(QuantizedGoldenTest, AwqAndGptqCheckpointsEqualTheirDequantizedDenseModel) {
  const std::string name = GetParam();
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-zero-point-" + case_label(name));
  const Golden g = read_golden(case_dir(name));
  struct Case {
    bool awq;
    int bits, group;
  };
  for (const Case c : {Case{true, 4, 32}, Case{false, 4, 32}, Case{false, 8, 32}, Case{false, 2, 32}}) {
    const std::string label = std::string(c.awq ? "AWQ" : "GPTQ") + " " + std::to_string(c.bits) + "-bit g" +
                              std::to_string(c.group);
    fs::remove_all(work);
    write_zero_point(name, work / "q", work / "dense", c.awq, c.bits, c.group);
    const Model quantized = load_model((work / "q").string()), reference = load_model((work / "dense").string());
    ASSERT_EQ(quantized.weights.layers[0].o.scheme, WeightScheme::kAffine) << label;
    const std::vector<float> got = prompt_logits(quantized, g), want = prompt_logits(reference, g);
    expect_same_logits(got, want, c.bits, g, label);
    EXPECT_EQ(greedy(quantized, g), greedy(reference, g)) << label;
  }
  // Act-order (g_idx not i / group) and AWQ's GEMV packing are refused by name.
  fs::remove_all(work);
  write_zero_point(name, work / "q", work / "dense", false, 4, 32);
  auto tensors = test::read_safetensors((work / "q" / "model.safetensors").string());
  const std::string g_idx = "model.layers.0.self_attn.o_proj.g_idx";
  if (tensors.count(g_idx) != 0) {
    std::swap(tensors[g_idx].bytes[0], tensors[g_idx].bytes[tensors[g_idx].bytes.size() - 4]);
    test::write_safetensors((work / "q" / "model.safetensors").string(), tensors);
    try {
      load_model((work / "q").string());
      ADD_FAILURE() << "a permuted g_idx loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("g_idx"), std::string::npos) << e.what();
    }
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(work / "q" / "config.json"));
  config["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"version", "gemv"}};
  std::ofstream(work / "q" / "config.json") << config.dump(2);
  try {
    load_model((work / "q").string());
    ADD_FAILURE() << "AWQ's GEMV packing loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemv"), std::string::npos) << e.what();
  }
  fs::remove_all(work);
}

// ---- FP8 e4m3 weights with block or per-row scales (the CPU widens them to bf16 at load) ----

using test::e4m3_nearest;
using test::e4m3_value;

// The golden model's projections in FP8 (quant_method fp8 with blocks of block×block, or
// compressed-tensors with a scale per output row), and the dense bf16 checkpoint of what
// they stand for, code × scale rounded to bf16.
void write_fp8(const std::string& name, const fs::path& out, const fs::path& dense, int block) {
  fs::create_directories(out);
  fs::create_directories(dense);
  const fs::path src = fs::path(model_dir(name));
  auto tensors = test::read_safetensors((src / "model.safetensors").string());
  std::map<std::string, test::RawTensor> packed, reference;
  for (auto& [tname, t] : tensors) {
    if (!is_projection(tname)) {
      packed[tname] = reference[tname] = t;
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int64_t br = block > 0 ? block : 1, bc = block > 0 ? block : cols;
    const int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
    std::vector<float> scales(static_cast<size_t>(srows * scols), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float& s = scales[static_cast<size_t>((r / br) * scols + c / bc)];
        s = std::max(s, std::abs(widen(t.dtype, t.bytes, static_cast<size_t>(r * cols + c))) / 448.0f);
      }
    test::RawTensor codes{"F8_E4M3", {rows, cols}, std::vector<uint8_t>(static_cast<size_t>(rows * cols))};
    test::RawTensor deq{"BF16", {rows, cols}, std::vector<uint8_t>(static_cast<size_t>(rows * cols * 2))};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = std::max(scales[static_cast<size_t>((r / br) * scols + c / bc)], 1e-12f);
        const uint8_t code = e4m3_nearest(widen(t.dtype, t.bytes, static_cast<size_t>(r * cols + c)) / s);
        codes.bytes[static_cast<size_t>(r * cols + c)] = code;
        const uint16_t v = f32_to_bf16(e4m3_value(code) * s);
        std::memcpy(deq.bytes.data() + (r * cols + c) * 2, &v, 2);
      }
    for (float& s : scales) s = std::max(s, 1e-12f);
    test::RawTensor scale{"F32", block > 0 ? std::vector<int64_t>{srows, scols} : std::vector<int64_t>{rows, 1},
                          std::vector<uint8_t>(scales.size() * 4)};
    std::memcpy(scale.bytes.data(), scales.data(), scale.bytes.size());
    const std::string module = tname.substr(0, tname.size() - 7);
    packed[tname] = std::move(codes);
    packed[module + (block > 0 ? ".weight_scale_inv" : ".weight_scale")] = std::move(scale);
    reference[tname] = std::move(deq);
  }
  test::write_safetensors((out / "model.safetensors").string(), packed);
  test::write_safetensors((dense / "model.safetensors").string(), reference);
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(src / "config.json"));
  std::ofstream(dense / "config.json") << config.dump(2);
  if (block > 0) {
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {block, block}}};
  } else {
    config["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"config_groups",
         {{"group_0", {{"targets", {"Linear"}}, {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}}}}}}};
  }
  std::ofstream(out / "config.json") << config.dump(2);
}

TEST_P(QuantizedGoldenTest, Fp8CheckpointsEqualTheirWidenedDenseModel) {
  const std::string name = GetParam();
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-fp8-" + case_label(name));
  const Golden g = read_golden(case_dir(name));
  for (int block : {32, 128, 0}) {
    fs::remove_all(work);
    write_fp8(name, work / "q", work / "dense", block);
    const Model fp8 = load_model((work / "q").string()), reference = load_model((work / "dense").string());
    const std::vector<float> got = prompt_logits(fp8, g), want = prompt_logits(reference, g);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "block " << block;
    double worst = 0;
    for (int64_t p = 0; p < g.positions; ++p)
      worst = std::max(worst, relative_error(got.data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab));
    std::printf("%s FP8 (block %d): worst relative error vs transformers %.4f\n", name.c_str(), block, worst);
  }
  fs::remove_all(work);
}

// CUDA runs 4- and 8-bit affine weights with kernels of its own (prompt rows on
// dequantized bf16 rows, decode rows through the MMA kernel); tensors of other shapes
// are widened as they load. Prompt logits within the bf16 tolerance of the CUDA goldens
// of the CPU's on the same checkpoint, and the same greedy tokens on both (fastest and
// batch-invariant decode).
TEST_P(QuantizedGoldenTest, CudaRunsQuantizedWeightsAsTheCpuDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
  const std::string name = GetParam();
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-quantized-cuda-" + case_label(name));
  const Golden g = read_golden(case_dir(name));
  for (auto [bits, group] : {std::pair{4, 32}, {8, 64}, {4, 64}}) {
    const std::string label = std::to_string(bits) + "-bit, groups of " + std::to_string(group);
    fs::remove_all(work);
    fs::create_directories(work);
    QuantizeOptions options;
    options.bits = bits;
    options.group_size = group;
    quantize_checkpoint(model_dir(name), (work / "q").string(), options);
    const Model model = load_model((work / "q").string());
    // CUDA's MoE kernels read bf16: it widens routers and experts to bf16 at load. A tiny
    // MoE's routing flips on such differences, so the CPU reference gets the same bf16
    // experts (the rest stays quantized).
    if (is_moe(name)) write_dequantized(work / "q", work / "bf16-experts", bf16_experts());
    const Model reference = is_moe(name) ? load_model((work / "bf16-experts").string()) : Model{};
    const std::vector<float> cpu = prompt_logits(is_moe(name) ? reference : model, g);
    const std::vector<int32_t> cpu_tokens = greedy(is_moe(name) ? reference : model, g);
    for (bool invariant : {false, true}) {
      BackendOptions options_cuda;
      options_cuda.device = "cuda";
      options_cuda.batch_invariant = invariant;
      auto cuda = make_backend(options_cuda);
      StandaloneRunner standalone = make_standalone_runner(model, {cuda.get()});
      KvCache kv = standalone->new_cache();
      std::vector<float> gpu(g.logits.size(), NAN);
      standalone->forward(g.prompt.data(), g.positions, kv, LogitsFor::kAllTokens, gpu.data());
      for (int64_t p = 0; p < g.positions; ++p)
        EXPECT_LE(relative_error(gpu.data() + p * g.vocab, cpu.data() + p * g.vocab, g.vocab), 2e-2)
            << label << ", position " << p;
      EngineCore core(model, nullptr, {cuda.get()}, EngineOptions{});
      GenerationRequest request;
      request.prompt = g.prompt;
      request.max_tokens = static_cast<int64_t>(g.greedy.size());
      EXPECT_EQ(generate(core, request).tokens, cpu_tokens) << label << (invariant ? ", invariant" : ", fastest");
    }
  }
  fs::remove_all(work);
}

// ---- --rotate-weights: the rotated float model keeps the source's function ----

TEST_P(QuantizedGoldenTest, RotatedWeightsGiveTheSameLogits) {
  const std::string name = GetParam();
  const fs::path work = fs::path(::testing::TempDir()) / ("kettle-rotated-" + case_label(name));
  fs::remove_all(work);
  fs::create_directories(work);
  QuantizeOptions options;
  options.quantize = false;
  options.rotate = true;
  options.rotation_seed = 11;
  const Model source = load_model(model_dir(name));
  if (source.spec.norm_add_one || source.spec.sandwich_norms || source.spec.n_experts > 0) {
    try {
      quantize_checkpoint(model_dir(name), (work / "r").string(), options);
      ADD_FAILURE() << name << ": a model whose norms do not commute with a rotation was rotated";
    } catch (const Error& e) {
      const char* named = source.spec.n_experts > 0 ? "mixtures of experts" : "--rotate-weights";
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(work / "r"));
    fs::remove_all(work);
    return;
  }
  quantize_checkpoint(model_dir(name), (work / "r").string(), options);
  const Model rotated = load_model((work / "r").string());
  const LayerWeights& first = rotated.weights.layers[0];
  EXPECT_EQ((first.q.empty() ? first.qkv : first.q).weight.dtype, DType::kF32);  // rotated weights are written as f32
  const Golden g = read_golden(case_dir(name));
  const std::vector<float> got = prompt_logits(rotated, g), want = prompt_logits(source, g);
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, 1e-3f) << name << ": the rotated model's logits moved";
  std::printf("%s: rotated, largest logit change %.2e\n", name.c_str(), worst);
  EXPECT_EQ(greedy(rotated, g), greedy(source, g));
  fs::remove_all(work);
}

// The rotation is orthogonal for every order it builds: whole for small ones, norms and
// inner products of random vectors for model-sized ones; orders without a factor refused.
TEST(RandomHadamardTest, OrthogonalAtEveryOrderItBuilds) {
  for (const int64_t n : {1, 2, 8, 12, 20, 28, 36, 44, 64, 384}) {
    const RandomHadamard q(n, 5);
    std::vector<std::vector<float>> rows;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> e(static_cast<size_t>(n), 0.0f);
      e[static_cast<size_t>(i)] = 1.0f;
      q.apply(e.data());
      rows.push_back(e);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += static_cast<double>(rows[i][k]) * rows[j][k];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << "order " << n << ", rows " << i << ", " << j;
      }
  }
  for (const int64_t n : {896, 1536, 2048, 3072, 3584, 4096, 5120, 7168}) {
    const RandomHadamard q(n, 9);
    std::mt19937 random(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) a[i] = normal(random), b[i] = normal(random);
    double before = 0, norm_before = 0;
    for (int64_t i = 0; i < n; ++i) before += static_cast<double>(a[i]) * b[i], norm_before += static_cast<double>(a[i]) * a[i];
    q.apply(a.data());
    q.apply(b.data());
    double after = 0, norm_after = 0;
    for (int64_t i = 0; i < n; ++i) after += static_cast<double>(a[i]) * b[i], norm_after += static_cast<double>(a[i]) * a[i];
    EXPECT_NEAR(after, before, 1e-3 * n) << n;
    EXPECT_NEAR(norm_after / norm_before, 1.0, 1e-5) << n;
  }
  for (const int64_t n : {3, 6, 100}) {
    EXPECT_FALSE(RandomHadamard::possible(n)) << n;
    EXPECT_THROW(RandomHadamard(n, 1), Error) << n;
  }
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
