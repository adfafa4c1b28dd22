// The local model registry's commands: `kettle get ORG/NAME` (hub_download.h),
// `kettle ls [query]` (every model in the
// Hugging Face hub cache and the --models-dir folders: id, architecture,
// parameters, quantization, bytes, context, and whether it fits this device
// as serve would load it) and `kettle gc` (superseded snapshots, unreferenced
// blobs and unfinished downloads in the hub cache: listed, removed with --yes).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/hub_download.h"
#include "cli/options.h"
#include "engine/memory_policy.h"
#include "model/config.h"
#include "model/hf_cache.h"
#include "model/memory_plan.h"
#include "model/model_runner.h"
#include "model/quant_config.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::cli {
namespace {

struct LsFlags {
  std::string query;
  std::vector<std::string> models_dirs;
  DeviceOption device;
  double device_share = 1.0;  // fits in this share of the device (a --model-pool engine's)
  bool json = false;
};

std::string human_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  return fmt::format("{:.1f} MB", bytes / 1e6);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.1f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  return fmt::format("{:.0f}K", n / 1e3);
}

// One model's row; a folder whose config cannot be read is listed with the reason.
nlohmann::json describe(const CachedModel& m, Backend& backend, size_t device_bytes) {
  nlohmann::json row = {{"id", m.id}, {"source", m.source}, {"folder", m.folder}, {"bytes", weight_file_bytes(m.folder)}};
  try {
    const ModelSpec spec = load_model_config(m.folder);
    row["arch"] = spec.model_type;
    row["context"] = spec.max_position_embeddings;
    // Elements of the weights, one byte each, every matrix widened: the parameter count
    // (biases and q/k norms left out, as the memory plan leaves them).
    row["parameters"] = plan_memory(spec, 1, WeightStorage(1), kv_layout(spec, DType::kF16), 1).weight_bytes;
    row["quantization"] = spec.quant.present()
                              ? nlohmann::json(fmt::format("{} {}-bit", quant_method_name(spec.quant.method),
                                                           spec.quant.defaults.bits))
                              : nlohmann::json(nullptr);
    MemoryFlags flags;
    try {
      const MemoryDecision d = decide_memory(spec, !backend.host_memory(), weight_storage(spec, backend),
                                             backend.kv_dtype(), device_bytes, flags);
      const int64_t limit = spec.max_position_embeddings > 0 ? spec.max_position_embeddings : int64_t{1} << 40;
      const int64_t longest = admitted_context(d, 1, limit);
      row["max_context"] = longest;
      row["fits"] = longest >= std::min<int64_t>(limit, 4096);
    } catch (const Error&) {
      row["max_context"] = 0;
      row["fits"] = false;  // the weights and working memory alone do not fit
    }
  } catch (const Error& e) {
    row["error"] = e.what();
  }
  return row;
}

int run_ls(const LsFlags& f) {
  log::set_level(log::Level::kQuiet);
  const std::string cache = hf_hub_cache_dir();
  for (const std::string& dir : f.models_dirs)
    if (!std::filesystem::is_directory(dir)) fail(ErrorCategory::kNotFound, "ls: --models-dir {}: no such folder", dir);
  std::vector<CachedModel> models = list_local_models(cache, f.models_dirs);
  std::erase_if(models, [&](const CachedModel& m) { return !id_contains(m.id, f.query); });
  auto backend = make_backend(f.device.backend_options(1));
  // A share of a GPU is of its whole memory (what a pool's engine gets), whatever is in use now.
  const size_t device_bytes =
      f.device_share < 1.0 && !backend->host_memory()
          ? static_cast<size_t>(static_cast<double>(backend->total_memory()) * f.device_share)
          : measured_memory_bytes(*backend, 1, f.device_share);
  nlohmann::json rows = nlohmann::json::array();
  for (const CachedModel& m : models) rows.push_back(describe(m, *backend, device_bytes));
  if (f.json) {
    std::printf("%s\n", nlohmann::json({{"hf_cache", cache}, {"device", backend->name()},
                                        {"device_bytes", device_bytes}, {"models", rows}})
                            .dump(2)
                            .c_str());
    return 0;
  }
  if (rows.empty()) {
    std::printf("no models%s in %s%s\n", f.query.empty() ? "" : fmt::format(" matching '{}'", f.query).c_str(), cache.c_str(),
                f.models_dirs.empty() ? "" : " or the --models-dir folders");
    return 0;
  }
  std::printf("| id | arch | parameters | quantization | bytes | context | fits %s (%s) |\n|---|---|---|---|---|---|---|\n",
              backend->name().c_str(), human_bytes(static_cast<double>(device_bytes)).c_str());
  for (const nlohmann::json& r : rows) {
    if (r.contains("error")) {
      std::printf("| %s | unreadable: %s | | | | | |\n", r["id"].get<std::string>().c_str(),
                  r["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("| %s | %s | %s | %s | %s | %lld | %s |\n", r["id"].get<std::string>().c_str(),
                r["arch"].get<std::string>().c_str(), human_count(r["parameters"].get<double>()).c_str(),
                r["quantization"].is_null() ? "-" : r["quantization"].get<std::string>().c_str(),
                human_bytes(r["bytes"].get<double>()).c_str(), static_cast<long long>(r["context"].get<int64_t>()),
                r["fits"].get<bool>() ? fmt::format("yes, {} positions", r["max_context"].get<int64_t>()).c_str() : "no");
  }
  return 0;
}

struct GcFlags {
  bool yes = false;
  bool json = false;
};

int run_gc(const GcFlags& f) {
  const std::string cache = hf_hub_cache_dir();
  const std::vector<Reclaimable> found = find_reclaimable(cache);
  size_t total = 0;
  for (const Reclaimable& r : found) total += r.bytes;
  std::vector<std::string> failed;
  if (f.yes)
    for (const Reclaimable& r : found) {
      std::error_code ec;
      std::filesystem::remove_all(r.path, ec);
      if (ec) failed.push_back(fmt::format("{}: {}", r.path, ec.message()));
    }
  if (f.json) {
    nlohmann::json items = nlohmann::json::array();
    for (const Reclaimable& r : found) items.push_back({{"path", r.path}, {"bytes", r.bytes}, {"why", r.why}});
    std::printf("%s\n", nlohmann::json({{"hf_cache", cache}, {"removed", f.yes}, {"items", items}, {"bytes", total},
                                        {"errors", failed}})
                            .dump(2)
                            .c_str());
  } else {
    for (const Reclaimable& r : found)
      std::printf("%s %s (%s, %s)\n", f.yes ? "removed" : "would remove", r.path.c_str(), r.why.c_str(),
                  human_bytes(static_cast<double>(r.bytes)).c_str());
    std::printf("%s: %zu item(s), %s in %s%s\n", f.yes ? "removed" : "dry run", found.size(),
                human_bytes(static_cast<double>(total)).c_str(), cache.c_str(),
                f.yes || found.empty() ? "" : "; run with --yes to remove them");
  }
  for (const std::string& e : failed) std::fprintf(stderr, "error: could not remove %s\n", e.c_str());
  return failed.empty() ? 0 : 1;
}

struct GetFlags {
  HubGetOptions hub;
};

int run_get(GetFlags f) {
  f.hub.cache_dir = hf_hub_cache_dir();
  const std::string folder = hub_get(f.hub);
  std::printf("%s\n", folder.c_str());
  return 0;
}

}  // namespace

Action register_get(CLI::App& app) {
  auto f = std::make_shared<GetFlags>();
  app.add_option("repo", f->hub.repo, "the model's id on the Hub (ORG/NAME)")->required();
  app.add_option("--revision", f->hub.revision, "a branch, tag or commit")->capture_default_str();
  return [f] { return run_get(*f); };
}

Action register_ls(CLI::App& app) {
  auto f = std::make_shared<LsFlags>();
  app.add_option("query", f->query, "only models whose id contains this (case-insensitive)");
  app.add_option("--models-dir", f->models_dirs, "a folder of model folders to list besides the hub cache; repeatable");
  app.add_flag("--json", f->json, "print one JSON object");
  app.add_option("--device-share", f->device_share,
                 "whether each model fits in this share of the device (of a GPU's whole memory, of the host's "
                 "available RAM), as an engine of `serve --model-pool` gets")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  f->device.add_to(app);
  return [f] { return run_ls(*f); };
}

Action register_gc(CLI::App& app) {
  auto f = std::make_shared<GcFlags>();
  app.add_flag("--yes", f->yes, "remove them (without it, only list what would go)");
  app.add_flag("--json", f->json, "print one JSON object");
  return [f] { return run_gc(*f); };
}

}  // namespace kettle::cli
