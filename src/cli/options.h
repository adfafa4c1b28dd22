// Flag values shared by commands, and their parsing into typed values with
// one-line errors naming the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/request.h"
#include "engine/speculation.h"
#include "kv/kv_quant.h"
#include "model/synthetic.h"

namespace kettle::cli {

// "1,2,3" (spaces allowed) → ids; an error names the flag and the bad item.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);

// --var k=v items → a JSON object; v is parsed as JSON when it parses (true, 3, "x", [..]),
// else taken as a string. An item without '=' is an error naming it.
nlohmann::ordered_json parse_template_vars(const std::vector<std::string>& vars);

// The model used when a command is given none: the bundled demo model.
std::string default_model_dir();

// The command line as parsed (after argv[0], with the default command inserted): what
// `serve --isolate` starts its engine child with.
void set_command_line(std::vector<std::string> args);
const std::vector<std::string>& command_line();
// The folder `model` names (a folder, else a query of the local Hugging Face cache,
// model/hf_cache.h) when given, else the default model (saying so on the terminal).
std::string model_or_default(const std::string& model);

// --temp/--top-k/--top-p/--min-p/--repetition-penalty: each overrides generation_config.json's
// default only when given; --presence-penalty/--frequency-penalty have no model default (0).
struct SamplingOptions {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  void add_to(CLI::App& app);
  // The model's defaults (as transformers applies them) with the given flags on top.
  SamplingParams resolve(const GenerationDefaults& defaults) const;

 private:
  CLI::Option* temperature_opt_ = nullptr;
  CLI::Option* top_k_opt_ = nullptr;
  CLI::Option* top_p_opt_ = nullptr;
  CLI::Option* min_p_opt_ = nullptr;
  CLI::Option* repetition_penalty_opt_ = nullptr;
};

struct ThreadOption {
  int threads = 0;  // 0: all cores
  void add_to(CLI::App& app);
  int resolve() const;
};

// --device cpu|cuda|auto (auto: cuda when built with CUDA and a GPU is present, else cpu);
// --batch-invariant (the default; --no-batch-invariant turns it off): decodes through
// kernels whose sums do not depend on the batch (BackendOptions::batch_invariant).
struct DeviceOption {
  std::string device = "auto";
  bool batch_invariant = true;
  std::string fp8_compute = "auto";
  void add_to(CLI::App& app);  // --device, --batch-invariant, --fp8-compute
  BackendOptions backend_options(int threads) const;
  void add_device_to(CLI::App& app, const std::string& what);  // --device alone; what: the help's subject
};

// --q-bits B [--q-group-size G] or --q-fp8 beside --synthetic: random quantized weights of
// the shape (bench, fit); refused by name without --synthetic or with bits it cannot make.
struct SyntheticQuantOption {
  SyntheticQuant quant;
  void add_to(CLI::App& app);
  SyntheticQuant resolve(bool synthetic) const;
};

// --kv-quant off|8|4|fp8|turbo[:kXvY]|config: how the KV cache stores its rows
// (kv/kv_quant.h; config reads the model's kv_config.json, model/kv_config.h).
struct KvQuantOption {
  std::string value = "off";
  void add_to(CLI::App& app);
  // model_dir empty: a synthetic model, which has no kv_config.json (config refused by name).
  KvQuant resolve(const std::string& model_dir) const;
};

// --draft-kind none|ngram|model, --draft-model DIR, --num-draft-tokens K, --ngram-max N,
// --ngram-min N: speculative decoding (engine/speculation.h); bad values refused by name.
struct SpeculationOption {
  std::string kind = "none";
  SpeculationOptions options;
  void add_to(CLI::App& app);
  SpeculationOptions resolve() const;

 private:
  CLI::Option *num_opt_ = nullptr, *ngram_max_opt_ = nullptr, *ngram_min_opt_ = nullptr;
};

// --tensor-parallel N (--tp): the model split over N ranks, one backend each.
struct TensorParallelOption {
  int ranks = 1;
  void add_to(CLI::App& app);
  // One backend per rank on `device`; CPU ranks share the `threads` cores.
  std::vector<std::unique_ptr<Backend>> make_backends(const DeviceOption& device, int threads) const;
};

}  // namespace kettle::cli
