// `kettle bench --draft-kind ...`: decode with and without speculation on one engine,
// alternating, B generations of one prompt at a time (the prompt's text from
// --prompt-file, or synthetic ids): decode tok/s of each, the speed-up, the share of
// drafted tokens accepted and the tokens each sequence gets per target step.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "engine/engine_core.h"

namespace kettle::cli {

struct SpeculationBench {
  std::vector<int32_t> prompt;
  float temperature = 0.0f;  // > 0: sampled (seeded per generation, the same seeds in both modes)
  int gen_tokens = 128;
  int repetitions = 3;
  std::vector<int> batches = {1};
  std::string model, backend, draft;  // for the report
  bool json = false;
};

// `core` was made with a drafter (EngineOptions::speculation) and room for the largest batch.
// Prints the table (or the JSON) and returns the results as --json gives them.
nlohmann::json run_speculation_bench(EngineCore& core, const SpeculationBench& bench);

}  // namespace kettle::cli
