// RoPE: reading the scaling block in either config spelling, and the
// inverse frequencies each scaling type implies (transformers'
// modeling_rope_utils: default, linear, dynamic, llama3, yarn, longrope).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "model/model_spec.h"

namespace kettle {

// A flat parameter block: transformers 5 rope_parameters (or one layer type's entry in it), or the
// older top-level rope_theta + rope_scaling merged by the caller.
RopeSpec parse_rope_block(const nlohmann::json& block, const nlohmann::json& config, const std::string& path);

struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  int rotary_dim = 0;
  float attention_factor = 1.0f;
};

// The table for a sequence that reaches seq_len tokens (dynamic and longrope depend on it),
// with inv_freq rounded to freq_dtype as transformers' buffer is.
RopeTable compute_rope_table(const RopeSpec& rope, int head_dim, int64_t max_position_embeddings,
                             int64_t seq_len, DType freq_dtype = DType::kF32);
// Whether the table changes with seq_len (so callers must recompute past a threshold).
bool rope_depends_on_length(const RopeSpec& rope);

}  // namespace kettle
