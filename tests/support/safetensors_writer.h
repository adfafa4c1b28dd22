// Test support: write safetensors files (to build sharded, re-typed or
// damaged checkpoints from the golden ones).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kettle::test {

struct RawTensor {
  std::string dtype;  // "BF16", "F16", "F32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::map<std::string, RawTensor> read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors);

// The same values in another dtype (BF16 source → F32 exactly, → F16 rounded).
RawTensor convert_tensor(const RawTensor& t, const std::string& dtype);

}  // namespace kettle::test
