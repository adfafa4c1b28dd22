#include "model/kv_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "util/error.h"

namespace kettle {
namespace {

constexpr std::uintmax_t kMaxFileBytes = 1 << 20;

int64_t integer_field(const nlohmann::json& entry, const char* key, const std::string& where) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_number_integer())
    fail(ErrorCategory::kInvalidArgument, "{}: \"{}\" must be an integer", where, key);
  return it->get<int64_t>();
}

}  // namespace

KvQuant read_kv_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "kv_config.json").string();
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(ErrorCategory::kInvalidArgument, "--kv-quant config reads {}, which cannot be read: {}", path, ec.message());
  if (size > kMaxFileBytes)
    fail(ErrorCategory::kInvalidArgument, "{} is {} bytes; a KV config is at most {}", path, size, kMaxFileBytes);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded()) fail(ErrorCategory::kInvalidArgument, "{} is not valid JSON", path);
  const nlohmann::json* list = &doc;
  if (doc.is_object()) {
    for (const auto& [key, value] : doc.items())
      if (key != "layers") fail(ErrorCategory::kInvalidArgument, "{}: unknown key \"{}\" (expected \"layers\")", path, key);
    if (!doc.contains("layers")) fail(ErrorCategory::kInvalidArgument, "{}: no \"layers\" list", path);
    list = &doc["layers"];
  }
  if (!list->is_array()) fail(ErrorCategory::kInvalidArgument, "{}: expected a list of layers", path);
  KvQuant quant;
  quant.mode = KvQuant::Mode::kConfig;
  std::set<int64_t> seen;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& entry = (*list)[i];
    const std::string where = path + " entry " + std::to_string(i);
    if (!entry.is_object()) fail(ErrorCategory::kInvalidArgument, "{}: expected an object", where);
    for (const auto& [key, value] : entry.items())
      if (key != "layer_idx" && key != "bits" && key != "group_size")
        fail(ErrorCategory::kInvalidArgument, "{}: unknown key \"{}\" (expected layer_idx, bits, group_size)", where, key);
    KvQuant::LayerBits layer;
    layer.layer = integer_field(entry, "layer_idx", where);
    layer.bits = static_cast<int>(integer_field(entry, "bits", where));
    layer.group_size = static_cast<int>(integer_field(entry, "group_size", where));
    if (layer.layer < 0) fail(ErrorCategory::kInvalidArgument, "{}: layer_idx {} is negative", where, layer.layer);
    if (layer.bits != 4 && layer.bits != 8)
      fail(ErrorCategory::kInvalidArgument, "{}: bits {}: a KV layer takes 4 or 8", where, layer.bits);
    if (layer.group_size != 32 && layer.group_size != 64 && layer.group_size != 128)
      fail(ErrorCategory::kInvalidArgument, "{}: group_size {}: a KV layer takes 32, 64 or 128", where, layer.group_size);
    if (!seen.insert(layer.layer).second)
      fail(ErrorCategory::kInvalidArgument, "{}: layer {} is listed twice", where, layer.layer);
    quant.layers.push_back(layer);
  }
  return quant;
}

}  // namespace kettle
