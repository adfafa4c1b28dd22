// `kettle fit`: will a model fit, before it is loaded? From config.json alone,
// through the memory policy serve uses (engine/memory_policy.h): the weights
// each device holds (split over --tensor-parallel ranks as serve splits them),
// a step's working memory, the KV budget serve would allocate with the same
// flags and the KV a token adds; the longest context that fits that budget;
// with --skus, the same for a table of GPUs with a decode speed predicted from
// their bandwidth.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/memory_policy.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::cli {
namespace {

// What a GPU keeps, as the CUDA backend does: bf16 matrices, 4- and 8-bit affine ones packed
// (its kernels' widths, cuda::affine_shape_supported; other widths widened to bf16), FP8
// ones on Hopper (Sku::hopper).
const WeightStorage kGpuStorage = WeightStorage::packed(2, {4, 8});

struct FitFlags {
  std::string model;
  std::string synthetic;
  SyntheticQuantOption synthetic_quant;
  KvQuantOption kv_quant;
  int64_t ctx = 0;  // 0: the model's own limit
  int64_t batch = 1;
  int tensor_parallel = 1;
  double memory_gb = 0.0;     // 0: what the device reports
  double kv_budget_gb = -1.0;  // serve's --kv-budget; unset: the policy's share
  double prompt_cache_gb = 8.0;
  int64_t prefill_chunk = 2048;
  bool skus = false;
  bool json = false;
  DeviceOption device;
};

// Datasheet memory and bandwidth. Predictions take 67 % of the datasheet bandwidth:
// kettle's 8b decode on the H200 streams 75 % of a measured copy ceiling that is
// itself 89 % of the datasheet figure (docs/performance.md).
struct Sku {
  const char* name;
  double memory_gb, bandwidth_gbs;
  bool hopper = false;  // FP8 weights stay FP8 (the CUDA backend's FP8 GEMMs)
};
constexpr Sku kSkus[] = {{"H200 141GB", 141, 4800, true}, {"H100 SXM 80GB", 80, 3350, true}, {"H100 PCIe 80GB", 80, 2000, true},
                         {"A100 80GB", 80, 2039},     {"A100 40GB", 40, 1555},     {"L40S 48GB", 48, 864},
                         {"RTX 6000 Ada 48GB", 48, 960}, {"RTX 4090 24GB", 24, 1008}, {"RTX 3090 24GB", 24, 936},
                         {"L4 24GB", 24, 300}};
constexpr double kStreamedFraction = 0.67;

double gb(size_t bytes) { return static_cast<double>(bytes) / 1e9; }

// Decode tokens per second of `batch` sequences at `ctx` positions: each step streams the
// rank's weights once and every sequence's KV cache.
double predicted_decode(const MemoryPlan& plan, double bandwidth_gbs, int64_t ctx, int64_t batch) {
  const double bytes = static_cast<double>(plan.streamed_bytes + plan.kv_bytes(ctx, batch));
  return kStreamedFraction * bandwidth_gbs * 1e9 / bytes * static_cast<double>(batch);
}

nlohmann::json verdict(const MemoryDecision& d, int64_t ctx, int64_t batch, int64_t limit) {
  const size_t need = d.plan.total_bytes(ctx, batch);
  return {{"device_bytes", d.device_bytes},
          {"needed_bytes", need},
          {"kv_budget_bytes", d.kv_budget_bytes},
          {"prompt_cache_bytes", d.prompt_cache_bytes},
          {"fits", d.plan.kv_bytes(ctx, batch) <= d.kv_budget_bytes},
          {"max_context", admitted_context(d, batch, limit)}};
}

MemoryFlags memory_flags(const FitFlags& f, const std::string& model_dir) {
  MemoryFlags m;
  m.kv_quant = f.kv_quant.resolve(model_dir);
  if (f.kv_budget_gb >= 0) m.kv_budget_gb = f.kv_budget_gb;
  if (f.memory_gb > 0) m.memory_budget_gb = f.memory_gb;
  m.prompt_cache_gb = f.prompt_cache_gb;
  m.prefill_chunk = f.prefill_chunk;
  m.ranks = f.tensor_parallel;
  return m;
}

int run_fit(const FitFlags& f) {
  if (f.json) log::set_level(log::Level::kQuiet);
  if (!f.model.empty() && !f.synthetic.empty())
    fail(ErrorCategory::kInvalidArgument, "fit: give a model folder or --synthetic PRESET, not both");
  const std::string source = f.synthetic.empty() ? model_or_default(f.model) : "synthetic:" + f.synthetic;
  const ModelSpec spec = f.synthetic.empty() ? load_model_config(source)
                                             : synthetic_spec(f.synthetic, f.synthetic_quant.resolve(true));
  if (f.synthetic.empty()) f.synthetic_quant.resolve(false);
  const int64_t limit = spec.max_position_embeddings > 0 ? spec.max_position_embeddings : int64_t{1} << 40;
  const int64_t ctx = f.ctx > 0 ? f.ctx : limit;
  if (ctx > limit) fail(ErrorCategory::kInvalidArgument, "--ctx {} is past the model's limit of {} positions", ctx, limit);

  nlohmann::json out{{"model", source}, {"ranks", f.tensor_parallel}, {"ctx", ctx}, {"batch", f.batch}};
  const MemoryFlags flags = memory_flags(f, f.synthetic.empty() ? source : "");
  if (flags.kv_quant.mode != KvQuant::Mode::kOff) out["kv_quant"] = flags.kv_quant.name();
  if (f.skus) {  // GPUs: weights as kGpuStorage, and an f16 KV cache, as the CUDA backend keeps them
    for (const Sku& sku : kSkus) {
      WeightStorage storage = kGpuStorage;
      storage.keeps_fp8 = sku.hopper && f.device.fp8_compute == "fp8";
      const MemoryDecision d =
          decide_memory(spec, true, storage, DType::kF16, static_cast<size_t>(sku.memory_gb * 1e9), flags);
      out["weight_bytes_per_rank"] = d.plan.weight_bytes;
      out["kv_bytes_per_token_per_rank"] = d.plan.kv_bytes_per_token + d.plan.window_kv_bytes_per_token;
      nlohmann::json row = verdict(d, ctx, f.batch, limit);
      row["gpu"] = sku.name;
      row["decode_tokens_per_second"] = predicted_decode(d.plan, sku.bandwidth_gbs, ctx, f.batch);
      out["skus"].push_back(row);
    }
  } else {
    auto backend = make_backend(f.device.backend_options(1));
    // Synthetic weights are bf16 (or quantized with their scales in bf16) on every device.
    WeightStorage weight_bytes = weight_storage(spec, *backend);
    if (!f.synthetic.empty()) weight_bytes.value_bytes = 2;
    const MemoryDecision d = decide_memory(spec, !backend->host_memory(), weight_bytes, backend->kv_dtype(),
                                           measured_memory_bytes(*backend, f.tensor_parallel), flags);
    out.update(verdict(d, ctx, f.batch, limit));
    out["device"] = backend->name();
    out["weight_bytes_per_rank"] = d.plan.weight_bytes;
    out["kv_bytes_per_token_per_rank"] = d.plan.kv_bytes_per_token + d.plan.window_kv_bytes_per_token;
    out["kv_bytes_per_rank"] = d.plan.kv_bytes(ctx, f.batch);
    out["working_bytes_per_rank"] = d.plan.working_bytes;
  }
  if (f.json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s: %lld position(s) × %lld sequence(s), %d rank(s)\n", source.c_str(), static_cast<long long>(ctx),
              static_cast<long long>(f.batch), f.tensor_parallel);
  std::printf("per rank: weights %.2f GB, KV %.1f KiB per token (--kv-quant %s)\n",
              gb(out["weight_bytes_per_rank"].get<size_t>()),
              static_cast<double>(out["kv_bytes_per_token_per_rank"].get<size_t>()) / 1024.0, flags.kv_quant.name().c_str());
  if (f.skus) {
    std::printf("| GPU | memory GB | needs GB per rank | fits | max context | predicted decode tok/s |\n|---|---|---|---|---|---|\n");
    for (const auto& row : out["skus"])
      std::printf("| %s | %.0f | %.2f | %s | %lld | %.0f |\n", row["gpu"].get<std::string>().c_str(),
                  gb(row["device_bytes"].get<size_t>()), gb(row["needed_bytes"].get<size_t>()),
                  row["fits"].get<bool>() ? "yes" : "no", static_cast<long long>(row["max_context"].get<int64_t>()),
                  row["decode_tokens_per_second"].get<double>());
    std::printf("(datasheet memory and bandwidth; decode predicted at %.0f %% of the bandwidth%s)\n", 100 * kStreamedFraction,
                f.tensor_parallel > 1 ? ", without the ranks' all-reduce time" : "");
    return 0;
  }
  std::printf("%s: KV budget %.2f GB (what serve allocates with these flags)\n", out["device"].get<std::string>().c_str(),
              gb(out["kv_budget_bytes"].get<size_t>()));
  std::printf("%s: KV %.2f GB + working %.2f GB → %.2f GB of %.2f GB per rank: %s; longest context that fits: %lld\n",
              out["device"].get<std::string>().c_str(), gb(out["kv_bytes_per_rank"].get<size_t>()),
              gb(out["working_bytes_per_rank"].get<size_t>()), gb(out["needed_bytes"].get<size_t>()),
              gb(out["device_bytes"].get<size_t>()), out["fits"].get<bool>() ? "fits" : "does not fit",
              static_cast<long long>(out["max_context"].get<int64_t>()));
  return 0;
}

}  // namespace

Action register_fit(CLI::App& app) {
  auto f = std::make_shared<FitFlags>();
  app.add_option("model", f->model, "Hugging Face model folder (only config.json is read)");
  app.add_option("--synthetic", f->synthetic, "a preset shape (llama-3.1-8b, ...) or a config.json path instead");
  f->synthetic_quant.add_to(app);
  app.add_option("--ctx", f->ctx, "positions per sequence (default: the model's limit)")->check(CLI::PositiveNumber);
  app.add_option("--batch", f->batch, "sequences held at once")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--tensor-parallel,--tp", f->tensor_parallel, "ranks the model is split over (as serve splits it)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--memory,--memory-budget", f->memory_gb,
                 "GB per rank for weights + working memory + KV, as serve's --memory-budget (default: what the "
                 "device reports free)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-budget", f->kv_budget_gb, "GB of KV cache, as serve's --kv-budget")->check(CLI::NonNegativeNumber);
  app.add_option("--prompt-cache", f->prompt_cache_gb, "GB of the KV cache kept for shared prefixes, as serve's")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prefill-chunk", f->prefill_chunk, "prompt tokens per step, as serve's (sizes the working memory)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--skus", f->skus, "a table of GPUs (datasheet memory and bandwidth) with predicted decode speed");
  app.add_flag("--json", f->json, "print one JSON object");
  f->device.add_to(app);
  f->kv_quant.add_to(app);
  return [f] { return run_fit(*f); };
}

}  // namespace kettle::cli
