// Shared flag parsing helpers.
#include "cli/options.h"

#include <algorithm>
#include <charconv>

#include <unistd.h>

#include "model/hf_cache.h"
#include "model/kv_config.h"
#include "tensor/affine_quant.h"
#include "util/error.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kettle::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0 || value > INT32_MAX)
      fail(ErrorCategory::kInvalidArgument, "{}: '{}' is not a token id (expected comma-separated non-negative integers)",
           flag, item);
    ids.push_back(static_cast<int32_t>(value));
    pos = comma + 1;
  }
  return ids;
}

nlohmann::ordered_json parse_template_vars(const std::vector<std::string>& vars) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& item : vars) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(ErrorCategory::kInvalidArgument, "--var {}: expected NAME=VALUE", item);
    std::string value = item.substr(eq + 1);
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    out[item.substr(0, eq)] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
  }
  return out;
}

namespace {
std::vector<std::string>& stored_command_line() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_line(std::vector<std::string> args) { stored_command_line() = std::move(args); }
const std::vector<std::string>& command_line() { return stored_command_line(); }

std::string default_model_dir() { return KETTLE_DEFAULT_MODEL; }

std::string model_or_default(const std::string& model) {
  if (!model.empty()) {
    std::string folder = resolve_model(model, hf_hub_cache_dir());
    if (folder != model) log::info("model '{}': {}", model, folder);
    return folder;
  }
  log::info("no --model given: using the bundled demo model {}", default_model_dir());
  return default_model_dir();
}

void SamplingOptions::add_to(CLI::App& app) {
  temperature_opt_ = app.add_option("--temp,--temperature", temperature,
                                    "sampling temperature, 0 = greedy (default: generation_config.json, else greedy)")
                         ->check(CLI::NonNegativeNumber);
  top_k_opt_ = app.add_option("--top-k", top_k, "keep the k most likely tokens, 0 = off (default: generation_config.json, else 50)")
                   ->check(CLI::NonNegativeNumber);
  top_p_opt_ = app.add_option("--top-p", top_p, "nucleus sampling mass, 1 = off (default: generation_config.json, else 1)")
                   ->check(CLI::Range(0.0f, 1.0f));
  min_p_opt_ = app.add_option("--min-p", min_p, "drop tokens below min_p × the top probability, 0 = off (default: 0)")
                   ->check(CLI::Range(0.0f, 1.0f));
  repetition_penalty_opt_ =
      app.add_option("--repetition-penalty", repetition_penalty,
                     "divide positive / multiply negative logits of tokens already in the prompt or output, 1 = off "
                     "(default: generation_config.json, else 1)")
          ->check(CLI::PositiveNumber);
  app.add_option("--presence-penalty", presence_penalty,
                 "subtract from the logit of every token already generated, -2 to 2 (default: 0)")
      ->check(CLI::Range(-2.0f, 2.0f));
  app.add_option("--frequency-penalty", frequency_penalty,
                 "subtract this × the times a token was generated from its logit, -2 to 2 (default: 0)")
      ->check(CLI::Range(-2.0f, 2.0f));
}

SamplingParams SamplingOptions::resolve(const GenerationDefaults& defaults) const {
  SamplingParams p = default_sampling(defaults);
  if (temperature_opt_->count()) p.temperature = temperature;
  if (top_k_opt_->count()) p.top_k = top_k;
  if (top_p_opt_->count()) p.top_p = top_p;
  if (min_p_opt_->count()) p.min_p = min_p;
  if (repetition_penalty_opt_->count()) p.repetition_penalty = repetition_penalty;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  return p;
}

void ThreadOption::add_to(CLI::App& app) {
  app.add_option("-t,--threads", threads, "CPU threads (0: one per available core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

int ThreadOption::resolve() const { return threads > 0 ? threads : ThreadPool::default_threads(); }

void SyntheticQuantOption::add_to(CLI::App& app) {
  app.add_option("--q-bits", quant.bits,
                 "with --synthetic: random affine-quantized weights of this many bits (2, 3, 4, 5, 6 or 8)");
  app.add_option("--q-group-size", quant.group_size, "with --q-bits: weights per scale and bias (32, 64 or 128)")
      ->capture_default_str();
  app.add_flag("--q-fp8", quant.fp8,
               "with --synthetic: random FP8 e4m3 weights with a scale per 128 × 128 block (quant_method fp8)");
}

SyntheticQuant SyntheticQuantOption::resolve(bool synthetic) const {
  if (quant.fp8) {
    if (!synthetic) fail(ErrorCategory::kInvalidArgument, "--q-fp8 makes random weights: it goes with --synthetic");
    if (quant.bits != 0) fail(ErrorCategory::kInvalidArgument, "--q-fp8 and --q-bits {}: one quantization or the other", quant.bits);
    return quant;
  }
  if (quant.bits == 0) return quant;
  if (!synthetic) fail(ErrorCategory::kInvalidArgument, "--q-bits makes random weights: it goes with --synthetic");
  if (!affine_bits_supported(quant.bits))
    fail(ErrorCategory::kInvalidArgument, "--q-bits {}: affine quantization takes 2, 3, 4, 5, 6 or 8 bits", quant.bits);
  if (!affine_group_size_supported(quant.group_size))
    fail(ErrorCategory::kInvalidArgument, "--q-group-size {}: affine quantization takes groups of 32, 64 or 128",
         quant.group_size);
  return quant;
}

void KvQuantOption::add_to(CLI::App& app) {
  app.add_option("--kv-quant", value,
                 "KV cache storage: off, 8 or 4 (affine bits per group of 64), fp8 (e4m3 per group of 64), "
                 "turbo[:kXvY] (keys X-bit affine, values rotated Y-bit Lloyd-Max; k8v3), or config (the model's "
                 "kv_config.json)")
      ->capture_default_str();
}

KvQuant KvQuantOption::resolve(const std::string& model_dir) const {
  KvQuant quant = parse_kv_quant(value);
  if (quant.mode != KvQuant::Mode::kConfig) return quant;
  if (model_dir.empty())
    fail(ErrorCategory::kInvalidArgument, "--kv-quant config reads the model's kv_config.json: a synthetic model has none");
  return read_kv_config(model_dir);
}

void SpeculationOption::add_to(CLI::App& app) {
  app.add_option("--draft-kind", kind,
                 "speculative decoding: none, ngram (prompt lookup: a repeated n-gram proposes what followed it) or "
                 "model (--draft-model drafts); the tokens are those decoding without it gives")
      ->capture_default_str();
  app.add_option("--draft-model", options.draft_model, "--draft-kind model: the draft's folder (the same vocabulary)");
  num_opt_ = app.add_option("--num-draft-tokens", options.num_draft_tokens,
                            "the most tokens drafted per step (each sequence adapts below it); default 10 for ngram, "
                            "3 for model");
  ngram_max_opt_ = app.add_option("--ngram-max", options.ngram_max, "--draft-kind ngram: the longest n-gram looked up")
                       ->capture_default_str();
  ngram_min_opt_ = app.add_option("--ngram-min", options.ngram_min, "--draft-kind ngram: the shortest n-gram looked up")
                       ->capture_default_str();
}

SpeculationOptions SpeculationOption::resolve() const {
  SpeculationOptions o = options;
  o.kind = parse_draft_kind(kind);
  if (o.kind == DraftKind::kNone && num_opt_ != nullptr && num_opt_->count() > 0)
    fail(ErrorCategory::kInvalidArgument, "--num-draft-tokens goes with --draft-kind ngram or model");
  for (CLI::Option* ngram : {ngram_max_opt_, ngram_min_opt_})
    if (o.kind != DraftKind::kNgram && ngram != nullptr && ngram->count() > 0)
      fail(ErrorCategory::kInvalidArgument, "{} goes with --draft-kind ngram", ngram->get_name());
  check_speculation(o);
  return o;
}

void DeviceOption::add_to(CLI::App& app) {
  add_device_to(app, "where the model runs");
  app.add_flag("--batch-invariant,!--no-batch-invariant", batch_invariant,
               "on (the default): decode through kernels whose sums do not depend on the batch, so a request's "
               "tokens are the same alone or batched (the CPU's always are); --no-batch-invariant: the fastest "
               "one-stream GPU decode, whose logits may differ in the last bits when batched");
  app.add_option("--fp8-compute", fp8_compute,
                 "FP8 checkpoints: fp8 (Hopper's FP8 tensor cores, activations quantized to FP8 per token and "
                 "128 channels as the checkpoint's reference runs them; an error on other devices), bf16 (widened "
                 "to bf16 at load: the exact product of the dequantized weights, twice the memory), auto (bf16 for "
                 "now)")
      ->check(CLI::IsMember({"auto", "fp8", "bf16"}))
      ->capture_default_str();
}

BackendOptions DeviceOption::backend_options(int threads) const {
  BackendOptions options;
  options.device = device;
  options.threads = std::max(1, threads);
  options.batch_invariant = batch_invariant;
  options.fp8 = parse_fp8_compute(fp8_compute);
  return options;
}

void DeviceOption::add_device_to(CLI::App& app, const std::string& what) {
  app.add_option("--device", device, what + ": cpu, cuda (device 0), cuda:N, or auto (cuda when a GPU is present)")
      ->check([](const std::string& d) {
        const bool ordinal = d.size() > 5 && d.starts_with("cuda:") &&
                             d.find_first_not_of("0123456789", 5) == std::string::npos;
        return d == "auto" || d == "cpu" || d == "cuda" || ordinal ? std::string()
                                                                    : "expected cpu, cuda, cuda:N or auto, got '" + d + "'";
      })
      ->capture_default_str();
}

void TensorParallelOption::add_to(CLI::App& app) {
  app.add_option("--tensor-parallel,--tp", ranks,
                 "split the model over N ranks (attention heads, MLP columns and vocabulary, Megatron-style); "
                 "CPU ranks share the cores; GPU ranks (NCCL) are not built yet")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

std::vector<std::unique_ptr<Backend>> TensorParallelOption::make_backends(const DeviceOption& device, int threads) const {
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < ranks; ++r) backends.push_back(make_backend(device.backend_options(threads / ranks)));
  return backends;
}

}  // namespace kettle::cli
