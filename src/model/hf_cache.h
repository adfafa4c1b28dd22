// The local model registry: models in the Hugging Face hub cache layout
// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub):
//   models--{org}--{name}/refs/main        the revision a plain name means
//   models--{org}--{name}/snapshots/{rev}/ the files (config.json, ...)
// A model argument that is not a folder is looked up here: "org/name"
// exactly (case-insensitive), else a unique case-insensitive substring of
// "org/name".
#pragma once

#include <string>
#include <vector>

namespace kettle {

struct CachedModel {
  std::string id;      // "org/name" (a --models-dir model: its folder's path under the dir)
  std::string folder;  // the snapshot folder holding config.json
  std::string source;  // "hf-cache", or the --models-dir it was found in
};

std::string hf_hub_cache_dir();
// Every cached model with a snapshot that has a config.json, sorted by id.
std::vector<CachedModel> list_cached_models(const std::string& cache_dir);
// The folder a model argument names: an existing folder as it is, else a registry match.
// Throws kettle::Error: kNotFound naming the query and the cache searched; kInvalidArgument
// listing the candidates when the query is ambiguous.
std::string resolve_model(const std::string& query, const std::string& cache_dir);

// The one model of `models` a query names: its id exactly (case-insensitive), else the one id
// containing it. Throws kettle::Error: kNotFound naming the query and `where`; kInvalidArgument
// listing the candidates when the query is ambiguous.
const CachedModel& find_model(const std::vector<CachedModel>& models, const std::string& query, const std::string& where);

// Whether `id` contains `query`, case-insensitively (ASCII): how a query names models.
bool id_contains(const std::string& id, const std::string& query);

// The models under a --models-dir: each folder (the dir itself or a child, one level) that
// holds a config.json, named by its path relative to dir; sorted by id.
std::vector<CachedModel> list_models_dir(const std::string& dir);

// Every local model: the hub cache's, then each --models-dir's (ls, serve --model-pool).
std::vector<CachedModel> list_local_models(const std::string& cache_dir, const std::vector<std::string>& models_dirs);

// What `kettle gc` may remove from the hub cache: snapshots no ref names (superseded by a
// newer revision), blobs no remaining snapshot links to, and unfinished downloads.
struct Reclaimable {
  std::string path;
  size_t bytes = 0;
  std::string why;  // "superseded snapshot", "unreferenced blob", "unfinished download"
};
std::vector<Reclaimable> find_reclaimable(const std::string& cache_dir);

// Bytes of a model folder's weight files (*.safetensors, links followed).
size_t weight_file_bytes(const std::string& folder);

}  // namespace kettle
