// generation_config.json: the model author's sampling defaults and stop ids.
#pragma once

#include <string>
#include <vector>

namespace kettle {

struct GenerationDefaults {
  bool do_sample = false;
  float temperature = 1.0f;
  int top_k = 50;  // transformers' default when sampling
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // applied greedy or not, as transformers does
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
};

// Reads folder/generation_config.json if present, and eos/bos from config.json as a fallback.
GenerationDefaults load_generation_defaults(const std::string& folder);

}  // namespace kettle
