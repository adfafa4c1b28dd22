// Writing a safetensors file tensor by tensor: the header (every tensor's dtype,
// shape and byte range, padded to 8 bytes) is written first from the plan, then
// each tensor's bytes in plan order, in pieces as they are made, so a writer
// never holds more than the piece it is given.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace kettle {

struct PlannedTensor {
  std::string name;
  std::string dtype;  // the safetensors spelling: "BF16", "U32", …
  std::vector<int64_t> shape;
  size_t bytes = 0;
};

class SafetensorsWriter {
 public:
  // Creates `path` (an error names it) and writes the header.
  SafetensorsWriter(const std::string& path, std::vector<PlannedTensor> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next bytes of the current tensor (pieces may not cross into the next tensor).
  void write(const void* data, size_t bytes);
  // Checks that every tensor was written whole, flushes, fsyncs and closes.
  void finish();

 private:
  std::string path_;
  std::vector<PlannedTensor> tensors_;
  std::FILE* file_ = nullptr;
  size_t current_ = 0;  // index of the tensor being written
  size_t written_ = 0;  // bytes of it so far
};

}  // namespace kettle
