// Synthetic model presets (shapes copied from the public config.json of each
// model) and a fast random bf16 fill. The tensors go through the same
// name binding and forward as a loaded checkpoint.
#include "model/synthetic.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <thread>

#include "model/config.h"
#include "tensor/host_buffer.h"
#include "util/error.h"

namespace kettle {
namespace {

const std::map<std::string, const char*>& presets() {
  static const std::map<std::string, const char*> kPresets = {
      {"llama-3.2-1b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":2048,"intermediate_size":8192,
        "num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,
        "max_position_embeddings":131072,"rms_norm_eps":1e-5,"tie_word_embeddings":true,"rope_theta":500000.0,
        "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"}})"},
      {"llama-3.1-8b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":131072,
        "rms_norm_eps":1e-5,"tie_word_embeddings":false,"rope_theta":500000.0,
        "rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"}})"},
      {"llama-3.1-70b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,
        "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"max_position_embeddings":131072,
        "rms_norm_eps":1e-5,"tie_word_embeddings":false,"rope_theta":500000.0,
        "rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"}})"},
      {"qwen3-0.6b", R"({"model_type":"qwen3","vocab_size":151936,"hidden_size":1024,"intermediate_size":3072,
        "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,
        "max_position_embeddings":40960,"rms_norm_eps":1e-6,"tie_word_embeddings":true,"rope_theta":1000000.0})"},
      {"qwen2.5-0.5b", R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":896,"intermediate_size":4864,
        "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
        "rms_norm_eps":1e-6,"tie_word_embeddings":true,"rope_theta":1000000.0})"},
      {"gemma-2-2b", R"({"model_type":"gemma2","vocab_size":256000,"hidden_size":2304,"intermediate_size":9216,
        "num_hidden_layers":26,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,
        "max_position_embeddings":8192,"rms_norm_eps":1e-6,"query_pre_attn_scalar":256,"sliding_window":4096,
        "attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,"rope_theta":10000.0})"},
      {"qwen3-30b-a3b", R"({"model_type":"qwen3_moe","vocab_size":151936,"hidden_size":2048,"intermediate_size":6144,
        "moe_intermediate_size":768,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,
        "head_dim":128,"num_experts":128,"num_experts_per_tok":8,"norm_topk_prob":true,"decoder_sparse_step":1,
        "mlp_only_layers":[],"max_position_embeddings":40960,"rms_norm_eps":1e-6,"tie_word_embeddings":false,
        "rope_theta":1000000.0})"},
      {"mixtral-8x7b", R"({"model_type":"mixtral","vocab_size":32000,"hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"num_local_experts":8,
        "num_experts_per_tok":2,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"tie_word_embeddings":false,
        "rope_theta":1000000.0})"},
      {"tiny", R"({"model_type":"llama","vocab_size":512,"hidden_size":64,"intermediate_size":160,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":4096})"},
  };
  return kPresets;
}

// Random values filled with xorshift on all cores (a 16 GB model fills in seconds): bf16
// weights of magnitude ~2^-7..2^-6 with random signs (norm weights: 1.0); for a quantized
// projection, random U32 codes, scales ~2^-9 and biases centring the codes on zero; for an
// FP8 one, e4m3 codes of magnitude 1..3.75 and block scales 2^-8.
std::shared_ptr<void> fabricate(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Tensor& out,
                                uint64_t seed, int bits) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  if (dtype == DType::kF8E4M3) numel = (numel + 1) / 2;  // two codes per u16 unit
  const size_t words = dtype == DType::kU32 ? 2 : 1;  // u16 units per element
  auto buffer = std::make_shared<HostBuffer<uint16_t>>(static_cast<size_t>(numel) * words);
  uint16_t* data = buffer->data();
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const bool is_norm = name.find("norm") != std::string::npos, is_scale = ends_with(".scales"),
             is_bias = ends_with(".biases"), is_fp8_scale = ends_with(".weight_scale_inv");
  const uint16_t scale = 0x3b00;  // 2^-9
  const uint16_t bias = f32_to_bf16(-bf16_to_f32(scale) * static_cast<float>((1 << bits) - 1) / 2);
  const int64_t units = numel * static_cast<int64_t>(words);
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t) {
    threads.emplace_back([=] {
      int64_t begin = units * t / n_threads, end = units * (t + 1) / n_threads;
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + std::hash<std::string>{}(name) + t * 0xBF58476D1CE4E5B9ull + 1;
      for (int64_t i = begin; i < end; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (dtype == DType::kU32) data[i] = static_cast<uint16_t>(x);
        else if (dtype == DType::kF8E4M3) data[i] = static_cast<uint16_t>((x & 0x8787) | 0x3838);  // exponents 7
        else if (is_fp8_scale) data[i] = 0x3b80;  // 2^-8
        else if (is_scale) data[i] = scale;
        else if (is_bias) data[i] = bias;
        else data[i] = is_norm ? uint16_t{0x3f80} : static_cast<uint16_t>((x & 0x807f) | 0x3c00);
      }
    });
  }
  for (auto& th : threads) th.join();
  out.data = data;
  out.dtype = dtype == DType::kU32 || dtype == DType::kF8E4M3 ? dtype : DType::kBF16;
  out.shape = shape;
  return buffer;
}

}  // namespace

std::vector<std::string> synthetic_presets() {
  std::vector<std::string> names;
  for (auto& [name, _] : presets()) names.push_back(name);
  return names;
}

ModelSpec synthetic_spec(const std::string& preset_or_config, SyntheticQuant quant) {
  nlohmann::json config;
  std::string path;
  auto it = presets().find(preset_or_config);
  if (it != presets().end()) {
    config = nlohmann::json::parse(it->second);
    path = "preset " + preset_or_config;
  } else if (std::filesystem::exists(preset_or_config)) {
    path = std::filesystem::is_directory(preset_or_config) ? preset_or_config + "/config.json" : preset_or_config;
    config = read_json_file(path);
  } else {
    std::string list;
    for (auto& name : synthetic_presets()) list += (list.empty() ? "" : ", ") + name;
    fail(ErrorCategory::kInvalidArgument, "--synthetic '{}' is neither a preset ({}) nor a config.json", preset_or_config, list);
  }
  if (quant.fp8) {
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {128, 128}}};
  } else if (quant.bits != 0) {
    config["quantization"] = {{"bits", quant.bits}, {"group_size", quant.group_size}};
    if (!config.contains("torch_dtype")) config["torch_dtype"] = "bfloat16";  // its scales and biases
  }
  return parse_model_config(config, path);
}

Model make_synthetic_model(const std::string& preset_or_config, uint64_t seed, SyntheticQuant quant) {
  Model model;
  model.source = "synthetic:" + preset_or_config;
  model.spec = synthetic_spec(preset_or_config, quant);
  model.store = std::make_shared<WeightStore>(WeightStore::fabricated(
      [seed, bits = quant.bits](const std::string& name, const std::vector<int64_t>& shape, DType dtype, Tensor& out) {
        return fabricate(name, shape, dtype, out, seed, bits);
      },
      quant.fp8 ? WeightStore::Fabricated::kFp8
                : quant.bits != 0 ? WeightStore::Fabricated::kAffine : WeightStore::Fabricated::kFloat));
  model.weights = bind_weights(model.spec, *model.store);
  return model;
}

}  // namespace kettle
