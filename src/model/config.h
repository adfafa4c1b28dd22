// config.json → ModelSpec, reading both the transformers-5 spelling
// (rope_parameters, layer_types) and the older one (rope_theta,
// rope_scaling, sliding_window + max_window_layers, sliding_window_pattern).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "model/model_spec.h"

namespace kettle {

ModelSpec parse_model_config(const nlohmann::json& config, const std::string& path);
ModelSpec load_model_config(const std::string& folder);  // reads folder/config.json

nlohmann::json read_json_file(const std::string& path);  // errors name the file

}  // namespace kettle
