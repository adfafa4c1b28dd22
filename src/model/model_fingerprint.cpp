// Hashes the small files whole and each safetensors file's header (the JSON
// after its 8-byte length).
#include "model/model_fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "util/digest.h"
#include "util/error.h"

namespace kettle {
namespace {

void hash_file(Sha256& h, const std::filesystem::path& path, size_t limit = SIZE_MAX) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::vector<char> buffer(1 << 16);
  size_t left = limit;
  h.update(path.filename().string());
  while (left > 0 && in) {
    in.read(buffer.data(), static_cast<std::streamsize>(std::min(buffer.size(), left)));
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    h.update(buffer.data(), n);
    left -= n;
  }
}

// A safetensors file: its size, then its header's length and bytes.
void hash_safetensors_header(Sha256& h, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char length[8] = {};
  in.read(reinterpret_cast<char*>(length), 8);
  uint64_t bytes = 0;
  for (int i = 7; i >= 0; --i) bytes = bytes << 8 | length[i];
  h.update(path.filename().string() + ":" + std::to_string(std::filesystem::file_size(path)));
  h.update(length, 8);
  std::vector<char> header(static_cast<size_t>(std::min<uint64_t>(bytes, 100u << 20)));
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  h.update(header.data(), static_cast<size_t>(in.gcount()));
}

}  // namespace

std::string model_folder_name(const std::string& folder) {
  std::filesystem::path p = std::filesystem::path(folder).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

ModelFingerprint model_fingerprint(const std::string& source) {
  ModelFingerprint fp;
  const std::filesystem::path dir(source);
  if (!std::filesystem::is_directory(dir)) {
    fp.weights = hex(sha256(source.data(), source.size()));
    fp.tokenizer = fp.weights;
    return fp;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  Sha256 weights, tokenizer;
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    if (name.ends_with(".safetensors")) hash_safetensors_header(weights, path);
    if (name == "config.json" || name.ends_with(".safetensors.index.json") || name == "quant_config.json") hash_file(weights, path);
    if (name == "tokenizer.json" || name == "tokenizer_config.json" || name == "special_tokens_map.json" ||
        name == "added_tokens.json")
      hash_file(tokenizer, path);
  }
  fp.weights = hex(weights.finish());
  fp.tokenizer = hex(tokenizer.finish());
  return fp;
}

}  // namespace kettle
