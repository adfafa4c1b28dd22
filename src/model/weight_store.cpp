// Opening a model folder's safetensors (single file or sharded by index).
#include "model/weight_store.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "util/error.h"

namespace kettle {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> shard_files(const fs::path& folder) {
  fs::path index = folder / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(ErrorCategory::kInvalidData, "{}: not a valid shard index (no weight_map object)", index.string());
    std::set<std::string> files;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(ErrorCategory::kInvalidData, "{}: weight_map entry '{}' is not a file name", index.string(), name);
      files.insert(file.get<std::string>());
    }
    std::vector<std::string> paths;
    for (auto& f : files) {
      fs::path p = folder / f;
      if (!fs::exists(p))
        fail(ErrorCategory::kNotFound, "{} names shard {}, which does not exist", index.string(), p.string());
      paths.push_back(p.string());
    }
    return paths;
  }
  fs::path single = folder / "model.safetensors";
  if (fs::exists(single)) return {single.string()};
  std::vector<std::string> found;
  for (auto& e : fs::directory_iterator(folder))
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  if (found.empty())
    fail(ErrorCategory::kNotFound, "{}: no model.safetensors, shard index or *.safetensors file", folder.string());
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

WeightStore WeightStore::open_folder(const std::string& folder) {
  WeightStore store;
  store.folder_ = folder;
  for (const auto& path : shard_files(folder)) {
    auto file = std::make_shared<SafetensorsFile>(path);
    for (const auto& [name, entry] : file->entries()) {
      if (entry.tensor.data == nullptr) {
        store.bad_dtype_[name] = entry.dtype_name;
        continue;
      }
      store.index_[name] = {entry.tensor, path};
    }
    store.files_.push_back(std::move(file));
  }
  return store;
}

namespace {

Tensor find_or_fail(const std::map<std::string, std::pair<Tensor, std::string>>& index,
                    const std::map<std::string, std::string>& bad_dtype, const std::string& folder,
                    const std::string& name) {
  auto it = index.find(name);
  if (it != index.end()) return it->second.first;
  auto bad = bad_dtype.find(name);
  if (bad != bad_dtype.end())
    fail(ErrorCategory::kUnsupported, "{}: tensor '{}' has dtype {}; expected BF16, F16 or F32", folder, name,
         bad->second);
  fail(ErrorCategory::kInvalidData, "{}: missing tensor '{}'", folder, name);
}

void check_shape(const Tensor& t, const std::string& folder, const std::string& name,
                 const std::vector<int64_t>& shape) {
  if (t.shape != shape)
    fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has shape {}, expected {} from config.json", folder, name,
         shape_string(t.shape), shape_string(shape));
}

}  // namespace

Tensor WeightStore::get(const std::string& name) const {
  Tensor t = find_or_fail(index_, bad_dtype_, folder_, name);
  if (!dtype_is_float(t.dtype))
    fail(ErrorCategory::kUnsupported,
         "{}: tensor '{}' holds packed {} codes, but the checkpoint has no scales for it (expected beside it as "
         "'.scales' and '.biases', with 'quantization' in config.json)",
         folder_, name, dtype_name(t.dtype));
  return t;
}

bool WeightStore::contains(const std::string& name) const {
  if (index_.count(name) != 0) return true;
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (fabricates_ == Fabricated::kFp8) return ends_with(".weight_scale_inv") && name.find("layers.") != std::string::npos;
  return fabricates_ == Fabricated::kAffine && (ends_with(".scales") || ends_with(".biases"));
}

void WeightStore::fabricate_if_missing(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const {
  if (!fabricator_ || index_.count(name) != 0) return;
  Tensor made;
  auto storage = fabricator_(name, shape, dtype, made);
  add_owned(name, made, std::move(storage));
}

Tensor WeightStore::get(const std::string& name, const std::vector<int64_t>& shape) const {
  fabricate_if_missing(name, shape, DType::kBF16);
  Tensor t = get(name);
  check_shape(t, folder_, name, shape);
  return t;
}

Tensor WeightStore::get_any(const std::string& name) const { return find_or_fail(index_, bad_dtype_, folder_, name); }

Tensor WeightStore::get_codes(const std::string& name, const std::vector<int64_t>& shape) const {
  fabricate_if_missing(name, shape, DType::kU32);
  Tensor t = find_or_fail(index_, bad_dtype_, folder_, name);
  if (t.dtype != DType::kU32)
    fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has dtype {} beside its scales; quantized codes are U32",
         folder_, name, dtype_name(t.dtype));
  check_shape(t, folder_, name, shape);
  return t;
}

Tensor WeightStore::get_fp8(const std::string& name, const std::vector<int64_t>& shape) const {
  fabricate_if_missing(name, shape, DType::kF8E4M3);
  Tensor t = find_or_fail(index_, bad_dtype_, folder_, name);
  if (t.dtype != DType::kF8E4M3)
    fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has dtype {}; an FP8 weight's codes are F8_E4M3", folder_, name,
         dtype_name(t.dtype));
  check_shape(t, folder_, name, shape);
  return t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (auto& [name, _] : index_) out.push_back(name);
  return out;
}

WeightStore WeightStore::fabricated(Fabricator fabricator, Fabricated quantized) {
  WeightStore store;
  store.fabricates_ = quantized;
  store.folder_ = "(synthetic)";
  store.fabricator_ = std::move(fabricator);
  return store;
}

void WeightStore::add_owned(const std::string& name, Tensor tensor, std::shared_ptr<void> storage) const {
  owned_.push_back(std::move(storage));
  index_[name] = {std::move(tensor), "(in memory)"};
}

}  // namespace kettle
