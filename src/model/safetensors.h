// safetensors: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw data. Parsed in
// place over a mapped file; every inconsistency is an error naming the file.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "tensor/tensor.h"
#include "util/mapped_file.h"

namespace kettle {

struct SafetensorsEntry {
  std::string dtype_name;  // as written, e.g. "BF16", "I64"
  Tensor tensor;           // data is null when the dtype is not computable (kept for the error)
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace kettle
