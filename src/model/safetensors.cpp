// safetensors parsing and validation (format: huggingface/safetensors README).
#include "model/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>

#include "util/error.h"

namespace kettle {
namespace {

size_t element_size_of(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"U16", 2}, {"U32", 4},  {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1},
      {"F8_E5M2", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_unique<MappedFile>(path)) {
  const size_t size = file_->size();
  if (size < 8) fail(ErrorCategory::kInvalidData, "{}: truncated safetensors file ({} bytes, no header)", path, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_->data(), 8);
  if (header_len > size - 8)
    fail(ErrorCategory::kInvalidData, "{}: corrupt or truncated safetensors file (header of {} bytes in a {}-byte file)",
         path, header_len, size);
  const char* header_begin = reinterpret_cast<const char*>(file_->data() + 8);
  nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object())
    fail(ErrorCategory::kInvalidData, "{}: corrupt safetensors header (not a JSON object)", path);

  const uint8_t* data = file_->data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has a malformed header entry", path, name);
    SafetensorsEntry entry;
    entry.dtype_name = info["dtype"].get<std::string>();
    uint64_t numel = 1;
    for (auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has a non-integer shape", path, name);
      entry.tensor.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    auto& offsets = info["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has non-integer data_offsets", path, name);
    uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(ErrorCategory::kInvalidData,
           "{}: tensor '{}' lies at bytes [{}, {}) but the file holds only {} data bytes (truncated?)",
           path, name, begin, end, data_size);
    size_t element = element_size_of(entry.dtype_name);
    if (element == 0) fail(ErrorCategory::kInvalidData, "{}: tensor '{}' has unknown dtype '{}'", path, name, entry.dtype_name);
    if (numel * element != end - begin)
      fail(ErrorCategory::kInvalidData, "{}: tensor '{}' of shape {} and dtype {} needs {} bytes, header gives {}",
           path, name, shape_string(entry.tensor.shape), entry.dtype_name, numel * element, end - begin);
    if (auto dtype = dtype_from_safetensors(entry.dtype_name)) {
      entry.tensor.dtype = *dtype;
      entry.tensor.data = data + begin;
    }
    entries_.emplace(name, std::move(entry));
  }
}

}  // namespace kettle
