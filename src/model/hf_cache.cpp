#include "model/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace kettle {
namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The snapshot refs/main points at when it is there and complete, else the newest with a config.json.
std::string snapshot_of(const fs::path& repo) {
  std::error_code ec;
  std::ifstream ref(repo / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && fs::exists(repo / "snapshots" / rev / "config.json", ec))
    return (repo / "snapshots" / rev).string();
  fs::path best;
  fs::file_time_type newest{};
  for (const auto& entry : fs::directory_iterator(repo / "snapshots", ec)) {
    if (!fs::exists(entry.path() / "config.json", ec)) continue;
    auto t = fs::last_write_time(entry.path(), ec);
    if (best.empty() || t > newest) {
      best = entry.path();
      newest = t;
    }
  }
  return best.string();
}

}  // namespace

std::string hf_hub_cache_dir() {
  if (const char* dir = std::getenv("HF_HUB_CACHE"); dir && *dir) return dir;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return (fs::path(home) / "hub").string();
  const char* user = std::getenv("HOME");
  return (fs::path(user ? user : "/") / ".cache" / "huggingface" / "hub").string();
}

std::vector<CachedModel> list_cached_models(const std::string& cache_dir) {
  std::vector<CachedModel> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("models--", 0) != 0 || !entry.is_directory(ec)) continue;
    std::string id = name.substr(8);
    const size_t sep = id.find("--");
    if (sep != std::string::npos) id = id.substr(0, sep) + "/" + id.substr(sep + 2);
    std::string folder = snapshot_of(entry.path());
    if (!folder.empty()) out.push_back({id, folder});
  }
  std::sort(out.begin(), out.end(), [](const CachedModel& a, const CachedModel& b) { return a.id < b.id; });
  return out;
}

std::string resolve_model(const std::string& query, const std::string& cache_dir) {
  std::error_code ec;
  if (fs::is_directory(query, ec)) return query;
  const std::vector<CachedModel> models = list_cached_models(cache_dir);
  const std::string q = lower(query);
  std::vector<const CachedModel*> matches;
  for (const CachedModel& m : models)
    if (lower(m.id) == q) return m.folder;
  for (const CachedModel& m : models)
    if (lower(m.id).find(q) != std::string::npos) matches.push_back(&m);
  if (matches.size() == 1) return matches[0]->folder;
  if (matches.empty())
    fail(ErrorCategory::kNotFound,
         "model '{}': no such folder, and no model in the local registry ({}) matches it ({} cached)", query, cache_dir,
         models.size());
  std::string names;
  for (const CachedModel* m : matches) names += (names.empty() ? "" : ", ") + m->id;
  fail(ErrorCategory::kInvalidArgument, "model '{}' matches {} cached models: {}; name one", query, matches.size(),
       names);
}

}  // namespace kettle
