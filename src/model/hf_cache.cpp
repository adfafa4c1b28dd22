#include "model/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

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
    if (!folder.empty()) out.push_back({id, folder, "hf-cache"});
  }
  std::sort(out.begin(), out.end(), [](const CachedModel& a, const CachedModel& b) { return a.id < b.id; });
  return out;
}

std::string resolve_model(const std::string& query, const std::string& cache_dir) {
  std::error_code ec;
  if (fs::is_directory(query, ec)) return query;
  const std::vector<CachedModel> models = list_cached_models(cache_dir);
  return find_model(models, query, fmt::format("no such folder, and the local registry ({}, {} cached)", cache_dir,
                                               models.size()))
      .folder;
}

const CachedModel& find_model(const std::vector<CachedModel>& models, const std::string& query, const std::string& where) {
  const std::string q = lower(query);
  for (const CachedModel& m : models)
    if (lower(m.id) == q) return m;
  std::vector<const CachedModel*> matches;
  for (const CachedModel& m : models)
    if (id_contains(m.id, query)) matches.push_back(&m);
  if (matches.size() == 1) return *matches[0];
  if (matches.empty()) fail(ErrorCategory::kNotFound, "model '{}': {} has no model of that name", query, where);
  std::string names;
  for (const CachedModel* m : matches) names += (names.empty() ? "" : ", ") + m->id;
  fail(ErrorCategory::kInvalidArgument, "model '{}' matches {} models: {}; name one", query, matches.size(), names);
}

std::vector<CachedModel> list_local_models(const std::string& cache_dir, const std::vector<std::string>& models_dirs) {
  std::vector<CachedModel> out = list_cached_models(cache_dir);
  for (const std::string& dir : models_dirs)
    for (CachedModel& m : list_models_dir(dir)) out.push_back(std::move(m));
  return out;
}

bool id_contains(const std::string& id, const std::string& query) {
  return lower(id).find(lower(query)) != std::string::npos;
}

std::vector<CachedModel> list_models_dir(const std::string& dir) {
  std::vector<CachedModel> out;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "config.json", ec)) out.push_back({fs::path(dir).filename().string(), dir, dir});
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory(ec) && fs::exists(entry.path() / "config.json", ec))
      out.push_back({entry.path().filename().string(), entry.path().string(), dir});
  std::sort(out.begin(), out.end(), [](const CachedModel& a, const CachedModel& b) { return a.id < b.id; });
  return out;
}

size_t weight_file_bytes(const std::string& folder) {
  size_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.path().extension() == ".safetensors") bytes += static_cast<size_t>(fs::file_size(entry.path(), ec));
  return bytes;
}

namespace {

// Bytes of the files under a folder (links not followed: a snapshot's files are links to blobs).
size_t tree_bytes(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(p, ec))) return fs::is_regular_file(fs::symlink_status(p, ec)) ? fs::file_size(p, ec) : 0;
  size_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(p, ec))
    if (fs::is_regular_file(entry.symlink_status(ec))) bytes += static_cast<size_t>(entry.file_size(ec));
  return bytes;
}

}  // namespace

std::vector<Reclaimable> find_reclaimable(const std::string& cache_dir) {
  std::vector<Reclaimable> out;
  std::error_code ec;
  std::vector<fs::path> repos;
  for (const auto& entry : fs::directory_iterator(cache_dir, ec))
    if (entry.path().filename().string().rfind("models--", 0) == 0 && entry.is_directory(ec)) repos.push_back(entry.path());
  std::sort(repos.begin(), repos.end());
  for (const fs::path& repo : repos) {
    std::vector<std::string> referenced;  // the revisions refs/* name
    for (const auto& ref : fs::recursive_directory_iterator(repo / "refs", ec)) {
      std::ifstream in(ref.path());
      std::string rev;
      if (ref.is_regular_file(ec) && std::getline(in, rev)) referenced.push_back(rev);
    }
    std::vector<fs::path> kept_snapshots;
    std::vector<fs::path> snapshots;
    for (const auto& snap : fs::directory_iterator(repo / "snapshots", ec)) snapshots.push_back(snap.path());
    std::sort(snapshots.begin(), snapshots.end());
    for (const fs::path& snap : snapshots) {
      const bool named = std::find(referenced.begin(), referenced.end(), snap.filename().string()) != referenced.end();
      // A repo without refs (a model copied in by hand) keeps its snapshots.
      if (named || referenced.empty())
        kept_snapshots.push_back(snap);
      else
        out.push_back({snap.string(), 0, "superseded snapshot"});
    }
    std::vector<std::string> linked;  // blob names the kept snapshots link to
    for (const fs::path& snap : kept_snapshots)
      for (const auto& file : fs::recursive_directory_iterator(snap, ec))
        if (file.is_symlink(ec)) linked.push_back(fs::read_symlink(file.path(), ec).filename().string());
    std::vector<fs::path> blobs;
    for (const auto& blob : fs::directory_iterator(repo / "blobs", ec)) blobs.push_back(blob.path());
    std::sort(blobs.begin(), blobs.end());
    for (const fs::path& blob : blobs) {
      const std::string name = blob.filename().string();
      if (name.size() > 11 && name.compare(name.size() - 11, 11, ".incomplete") == 0)
        out.push_back({blob.string(), tree_bytes(blob), "unfinished download"});
      else if (std::find(linked.begin(), linked.end(), name) == linked.end())
        out.push_back({blob.string(), tree_bytes(blob), "unreferenced blob"});
    }
  }
  // A superseded snapshot's own bytes are its links (its blobs are counted where unreferenced).
  for (Reclaimable& r : out)
    if (r.why == "superseded snapshot") r.bytes = tree_bytes(r.path);
  return out;
}

}  // namespace kettle
