// RoPE parameter parsing and inverse-frequency computation, in float32 as
// torch computes them so that angles match transformers bit for bit where
// the math allows.
#include "model/rope_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace kettle {
namespace {

double number_or(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail(ErrorCategory::kInvalidData, "rope parameter '{}' is not a number", key);
  return it->get<double>();
}

std::vector<double> factors(const nlohmann::json& j, const char* key) {
  std::vector<double> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (auto& v : *it) out.push_back(v.get<double>());
  return out;
}

RopeType parse_type(const std::string& name, const std::string& path) {
  if (name == "default" || name.empty()) return RopeType::kDefault;
  if (name == "linear") return RopeType::kLinear;
  if (name == "dynamic") return RopeType::kDynamic;
  if (name == "llama3") return RopeType::kLlama3;
  if (name == "yarn") return RopeType::kYarn;
  if (name == "longrope" || name == "su") return RopeType::kLongRope;
  fail(ErrorCategory::kUnsupported, "{}: rope type '{}' is not supported (default, linear, dynamic, llama3, yarn, longrope)",
       path, name);
}

float mscale_of(double scale, double mscale) {
  if (scale <= 1.0) return 1.0f;
  return static_cast<float>(0.1 * mscale * std::log(scale) + 1.0);
}

std::vector<float> base_inv_freq(double theta, int dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  return inv;
}

void apply_llama3(const RopeSpec& r, std::vector<float>& inv) {
  const float factor = static_cast<float>(r.factor);
  const float low = static_cast<float>(r.low_freq_factor), high = static_cast<float>(r.high_freq_factor);
  const float old_ctx = static_cast<float>(r.original_max_position);
  const float low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  for (auto& f : inv) {
    float wavelen = 2.0f * static_cast<float>(M_PI) / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      float smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
}

void apply_yarn(const RopeSpec& r, int dim, int64_t original_max, std::vector<float>& inv, float& attention) {
  const double base = r.theta;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(static_cast<double>(original_max) / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(r.factor);
  for (size_t i = 0; i < inv.size(); ++i) {
    float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    float extrapolation_factor = 1.0f - ramp;
    float extrapolated = inv[i];
    float interpolated = inv[i] / factor;
    inv[i] = interpolated * (1.0f - extrapolation_factor) + extrapolated * extrapolation_factor;
  }
  if (r.attention_factor > 0) {
    attention = static_cast<float>(r.attention_factor);
  } else if (r.mscale > 0 && r.mscale_all_dim > 0) {
    attention = mscale_of(r.factor, r.mscale) / mscale_of(r.factor, r.mscale_all_dim);
  } else {
    attention = mscale_of(r.factor, 1.0);
  }
}

}  // namespace

RopeSpec parse_rope_block(const nlohmann::json& block, const nlohmann::json& config, const std::string& path) {
  RopeSpec r;
  std::string type = "default";
  if (block.contains("rope_type") && block["rope_type"].is_string()) type = block["rope_type"].get<std::string>();
  else if (block.contains("type") && block["type"].is_string()) type = block["type"].get<std::string>();
  r.type = parse_type(type, path);
  r.theta = number_or(block, "rope_theta", number_or(config, "rope_theta", 10000.0));
  r.factor = number_or(block, "factor", 1.0);
  r.partial_rotary_factor = number_or(block, "partial_rotary_factor", number_or(config, "partial_rotary_factor", 1.0));
  r.low_freq_factor = number_or(block, "low_freq_factor", 1.0);
  r.high_freq_factor = number_or(block, "high_freq_factor", 4.0);
  r.original_max_position = static_cast<int64_t>(number_or(
      block, "original_max_position_embeddings", number_or(config, "original_max_position_embeddings", 0)));
  r.beta_fast = number_or(block, "beta_fast", 32.0);
  r.beta_slow = number_or(block, "beta_slow", 1.0);
  r.mscale = number_or(block, "mscale", 0.0);
  r.mscale_all_dim = number_or(block, "mscale_all_dim", 0.0);
  r.attention_factor = number_or(block, "attention_factor", 0.0);
  if (block.contains("truncate") && block["truncate"].is_boolean()) r.truncate = block["truncate"].get<bool>();
  r.short_factor = factors(block, "short_factor");
  r.long_factor = factors(block, "long_factor");
  if (r.type == RopeType::kLlama3 && r.original_max_position <= 0)
    fail(ErrorCategory::kInvalidData, "{}: llama3 rope scaling needs original_max_position_embeddings", path);
  if (r.type == RopeType::kLongRope && (r.short_factor.empty() || r.long_factor.empty()))
    fail(ErrorCategory::kInvalidData, "{}: longrope scaling needs short_factor and long_factor", path);
  return r;
}

bool rope_depends_on_length(const RopeSpec& rope) {
  return rope.type == RopeType::kDynamic || rope.type == RopeType::kLongRope;
}

RopeTable compute_rope_table(const RopeSpec& r, int head_dim, int64_t max_position_embeddings, int64_t seq_len,
                             DType freq_dtype) {
  RopeTable table;
  int dim = static_cast<int>(head_dim * r.partial_rotary_factor);
  dim -= dim % 2;
  table.rotary_dim = dim;
  double theta = r.theta;
  if (r.type == RopeType::kDynamic && seq_len > max_position_embeddings) {
    double ratio = r.factor * static_cast<double>(seq_len) / static_cast<double>(max_position_embeddings) - (r.factor - 1);
    theta = theta * std::pow(ratio, static_cast<double>(dim) / (dim - 2));
  }
  table.inv_freq = base_inv_freq(theta, dim);
  switch (r.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:
      break;
    case RopeType::kLinear:
      for (auto& f : table.inv_freq) f /= static_cast<float>(r.factor);
      break;
    case RopeType::kLlama3:
      apply_llama3(r, table.inv_freq);
      break;
    case RopeType::kYarn: {
      int64_t original = r.original_max_position > 0 ? r.original_max_position : max_position_embeddings;
      apply_yarn(r, dim, original, table.inv_freq, table.attention_factor);
      break;
    }
    case RopeType::kLongRope: {
      int64_t original = r.original_max_position > 0 ? r.original_max_position : max_position_embeddings;
      const auto& ext = seq_len > original ? r.long_factor : r.short_factor;
      if (static_cast<int>(ext.size()) != dim / 2)
        fail(ErrorCategory::kInvalidData, "longrope factors have {} entries, expected rotary_dim/2 = {}", ext.size(), dim / 2);
      for (size_t i = 0; i < table.inv_freq.size(); ++i) table.inv_freq[i] /= static_cast<float>(ext[i]);
      double factor = static_cast<double>(max_position_embeddings) / static_cast<double>(original);
      if (r.attention_factor > 0) table.attention_factor = static_cast<float>(r.attention_factor);
      else if (factor > 1.0)
        table.attention_factor = static_cast<float>(std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(original))));
      break;
    }
  }
  for (auto& f : table.inv_freq) {
    if (freq_dtype == DType::kBF16) f = bf16_to_f32(f32_to_bf16(f));
    if (freq_dtype == DType::kF16) f = f16_to_f32(f32_to_f16(f));
  }
  return table;
}

}  // namespace kettle
