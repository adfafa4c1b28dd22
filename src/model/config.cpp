// Config parsing: the architecture's table row gives what config.json leaves
// implicit; every missing or malformed key is an error naming it.
#include "model/config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/arch/arch_table.h"
#include "model/rope_config.h"
#include "util/error.h"

namespace kettle {
namespace {

using nlohmann::json;

bool has(const json& c, const char* key) { return c.contains(key) && !c[key].is_null(); }

int64_t get_int(const json& c, const char* key, const std::string& path) {
  if (!has(c, key)) fail(ErrorCategory::kInvalidData, "{}: missing '{}'", path, key);
  if (!c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
    fail(ErrorCategory::kInvalidData, "{}: '{}' must be a positive integer, got {}", path, key, c[key].dump());
  return c[key].get<int64_t>();
}

int64_t int_or(const json& c, const char* key, int64_t fallback, const std::string& path) {
  return has(c, key) ? get_int(c, key, path) : fallback;
}

double number_or(const json& c, const char* key, double fallback, const std::string& path) {
  if (!has(c, key)) return fallback;
  if (!c[key].is_number()) fail(ErrorCategory::kInvalidData, "{}: '{}' must be a number, got {}", path, key, c[key].dump());
  return c[key].get<double>();
}

Activation parse_activation(const json& c, const ArchTable& arch, const std::string& path) {
  std::string name;
  if (has(c, "hidden_activation")) name = c["hidden_activation"].get<std::string>();
  else if (has(c, "hidden_act")) name = c["hidden_act"].get<std::string>();
  else return arch.default_act;
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return Activation::kGeluTanh;
  if (name == "gelu") return Activation::kGelu;
  fail(ErrorCategory::kUnsupported, "{}: activation '{}' is not supported (silu, gelu, gelu_pytorch_tanh)", path, name);
}

// Which layers slide, from layer_types (transformers 5) or the family's older rule.
std::vector<std::string> layer_types(const json& c, const ArchTable& arch, int64_t n_layers, const std::string& path) {
  std::vector<std::string> types(static_cast<size_t>(n_layers), "full_attention");
  if (has(c, "layer_types")) {
    const json& lt = c["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != n_layers)
      fail(ErrorCategory::kInvalidData, "{}: 'layer_types' must list {} entries", path, n_layers);
    for (int64_t i = 0; i < n_layers; ++i) {
      std::string t = lt[static_cast<size_t>(i)].get<std::string>();
      if (t != "full_attention" && t != "sliding_attention")
        fail(ErrorCategory::kUnsupported, "{}: layer type '{}' (layer {}) is not supported", path, t, i);
      types[static_cast<size_t>(i)] = t;
    }
    return types;
  }
  const bool window_set = has(c, "sliding_window");
  for (int64_t i = 0; i < n_layers; ++i) {
    bool sliding = false;
    switch (arch.sliding) {
      case SlidingRule::kNone: break;
      case SlidingRule::kAllLayers: sliding = window_set; break;
      case SlidingRule::kFromMaxWindow:
        sliding = window_set && c.value("use_sliding_window", false) &&
                  i >= int_or(c, "max_window_layers", 0, path);
        break;
      case SlidingRule::kEveryNth: {
        int64_t pattern = has(c, "sliding_window_pattern") ? get_int(c, "sliding_window_pattern", path)
                          : has(c, "_sliding_window_pattern") ? get_int(c, "_sliding_window_pattern", path)
                                                              : arch.default_sliding_pattern;
        sliding = window_set && (i + 1) % pattern != 0;
        break;
      }
    }
    if (sliding) types[static_cast<size_t>(i)] = "sliding_attention";
  }
  return types;
}

// RoPE specs and which one each layer type uses.
void parse_ropes(const json& c, const std::vector<std::string>& types, ModelSpec& spec, const std::string& path) {
  std::map<std::string, int> by_type;
  if (has(c, "rope_parameters") && c["rope_parameters"].is_object()) {
    const json& rp = c["rope_parameters"];
    bool per_type = !rp.empty() && std::all_of(rp.begin(), rp.end(), [](const json& v) { return v.is_object(); });
    if (per_type) {
      for (auto& [type, block] : rp.items()) {
        by_type[type] = static_cast<int>(spec.ropes.size());
        spec.ropes.push_back(parse_rope_block(block, c, path));
      }
    } else {
      spec.ropes.push_back(parse_rope_block(rp, c, path));
    }
  } else {
    json block = has(c, "rope_scaling") && c["rope_scaling"].is_object() ? c["rope_scaling"] : json::object();
    spec.ropes.push_back(parse_rope_block(block, c, path));
    if (has(c, "rope_local_base_freq")) {  // Gemma 3: sliding layers rotate with their own base, unscaled
      json local = {{"rope_type", "default"}, {"rope_theta", c["rope_local_base_freq"]}};
      by_type["full_attention"] = 0;
      by_type["sliding_attention"] = 1;
      spec.ropes.push_back(parse_rope_block(local, c, path));
    }
  }
  for (size_t i = 0; i < types.size(); ++i) {
    auto it = by_type.find(types[i]);
    if (it != by_type.end()) spec.layers[i].rope = it->second;
    else if (!by_type.empty() && spec.ropes.size() > 1)
      fail(ErrorCategory::kInvalidData, "{}: rope_parameters has no entry for layer type '{}'", path, types[i]);
  }
}

void parse_moe(const json& c, const ArchTable& arch, ModelSpec& spec, const std::string& path) {
  if (!arch.moe) return;
  spec.n_experts = static_cast<int>(has(c, "num_local_experts") ? get_int(c, "num_local_experts", path)
                                                                 : get_int(c, "num_experts", path));
  spec.experts_per_token = static_cast<int>(get_int(c, "num_experts_per_tok", path));
  if (spec.experts_per_token > spec.n_experts)
    fail(ErrorCategory::kInvalidData, "{}: num_experts_per_tok {} exceeds the {} experts", path,
         spec.experts_per_token, spec.n_experts);
  spec.expert_intermediate_size = int_or(c, "moe_intermediate_size", spec.intermediate_size, path);
  // Mixtral always renormalises the top-k weights; Qwen-MoE says so in norm_topk_prob (default off).
  spec.norm_topk_prob = arch.model_type == "mixtral" ? true : c.value("norm_topk_prob", false);
  std::vector<int64_t> dense_layers;
  if (has(c, "mlp_only_layers")) dense_layers = c["mlp_only_layers"].get<std::vector<int64_t>>();
  int64_t step = int_or(c, "decoder_sparse_step", 1, path);
  for (int64_t i = 0; i < spec.n_layers; ++i) {
    bool dense = std::find(dense_layers.begin(), dense_layers.end(), i) != dense_layers.end();
    spec.layers[static_cast<size_t>(i)].moe = !dense && (i + 1) % step == 0;
  }
}

}  // namespace

ModelSpec parse_model_config(const json& c, const std::string& path) {
  if (!c.is_object()) fail(ErrorCategory::kInvalidData, "{}: not a JSON object", path);
  if (!has(c, "model_type") || !c["model_type"].is_string())
    fail(ErrorCategory::kInvalidData, "{}: missing 'model_type'", path);
  ModelSpec spec;
  spec.model_type = c["model_type"].get<std::string>();
  const ArchTable& arch = arch_table(spec.model_type, path);

  spec.vocab_size = get_int(c, "vocab_size", path);
  spec.hidden_size = get_int(c, "hidden_size", path);
  spec.n_layers = get_int(c, "num_hidden_layers", path);
  spec.intermediate_size = get_int(c, "intermediate_size", path);
  spec.n_heads = static_cast<int>(get_int(c, "num_attention_heads", path));
  spec.n_kv_heads = static_cast<int>(int_or(c, "num_key_value_heads", spec.n_heads, path));
  if (spec.n_heads % spec.n_kv_heads != 0)
    fail(ErrorCategory::kInvalidData, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path,
         spec.n_heads, spec.n_kv_heads);
  if (!has(c, "head_dim") && spec.hidden_size % spec.n_heads != 0)
    fail(ErrorCategory::kInvalidData, "{}: hidden_size {} is not divisible by num_attention_heads {}", path,
         spec.hidden_size, spec.n_heads);
  spec.head_dim = static_cast<int>(int_or(c, "head_dim", spec.hidden_size / spec.n_heads, path));
  spec.max_position_embeddings = int_or(c, "max_position_embeddings", 2048, path);

  spec.rms_norm_eps = static_cast<float>(number_or(c, "rms_norm_eps", 1e-6, path));
  spec.norm_add_one = arch.gemma_norms;
  spec.sandwich_norms = arch.sandwich_norms;
  spec.act = parse_activation(c, arch, path);
  spec.embed_scale = arch.scaled_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(spec.hidden_size))) : 1.0f;
  double scalar = arch.query_pre_attn_scalar ? number_or(c, "query_pre_attn_scalar", spec.head_dim, path) : spec.head_dim;
  spec.attn_scale = static_cast<float>(std::pow(scalar, -0.5));
  // transformers applies attn_logit_softcapping only on its eager attention path; its default
  // (SDPA) path leaves scores uncapped, and that is the reference we reproduce. A config that
  // asks for eager attention gets the cap.
  const bool eager = c.value("attn_implementation", std::string()) == "eager" ||
                     c.value("_attn_implementation", std::string()) == "eager";
  if (eager) spec.attn_softcap = static_cast<float>(number_or(c, "attn_logit_softcapping", 0.0, path));
  spec.final_softcap = static_cast<float>(number_or(c, "final_logit_softcapping", 0.0, path));
  spec.tie_word_embeddings = has(c, "tie_word_embeddings") ? c["tie_word_embeddings"].get<bool>() : arch.default_tie_embeddings;

  spec.layers.resize(static_cast<size_t>(spec.n_layers));
  auto types = layer_types(c, arch, spec.n_layers, path);
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "sliding_attention") continue;
    if (!has(c, "sliding_window"))
      fail(ErrorCategory::kInvalidData, "{}: layer {} is sliding_attention but 'sliding_window' is not set", path, i);
    spec.layers[i].sliding_window = static_cast<int>(get_int(c, "sliding_window", path));
  }
  parse_ropes(c, types, spec, path);
  const char* dtype_key = has(c, "dtype") ? "dtype" : "torch_dtype";
  if (has(c, dtype_key) && c[dtype_key].is_string()) {
    std::string dtype = c[dtype_key].get<std::string>();
    if (dtype == "bfloat16") spec.rope_freq_dtype = DType::kBF16;
    if (dtype == "float16") spec.rope_freq_dtype = DType::kF16;
  }
  parse_moe(c, arch, spec, path);
  spec.quant = parse_quant_config(c, path);
  return spec;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (!std::filesystem::exists(path)) fail(ErrorCategory::kNotFound, "{} does not exist", path);
    fail(ErrorCategory::kInvalidData, "cannot read {}", path);
  }
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) fail(ErrorCategory::kInvalidData, "{}: not valid JSON", path);
  return j;
}

ModelSpec load_model_config(const std::string& folder) {
  namespace fs = std::filesystem;
  if (!fs::exists(folder)) fail(ErrorCategory::kNotFound, "model folder {} does not exist", folder);
  if (!fs::is_directory(folder)) fail(ErrorCategory::kInvalidArgument, "{} is not a model folder", folder);
  std::string path = (fs::path(folder) / "config.json").string();
  if (!fs::exists(path)) fail(ErrorCategory::kNotFound, "{}: no config.json (not a Hugging Face model folder?)", folder);
  return parse_model_config(read_json_file(path), path);
}

}  // namespace kettle
