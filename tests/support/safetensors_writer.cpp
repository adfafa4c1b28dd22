// A minimal safetensors reader/writer for building test checkpoints.
#include "support/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "tensor/dtype.h"

namespace kettle::test {

std::map<std::string, RawTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, RawTensor> out;
  const nlohmann::json parsed = nlohmann::json::parse(header);
  for (auto& [name, info] : parsed.items()) {
    if (name == "__metadata__") continue;
    RawTensor t;
    t.dtype = info["dtype"];
    t.shape = info["shape"].get<std::vector<int64_t>>();
    size_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    t.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(b), data.begin() + static_cast<std::ptrdiff_t>(e));
    out[name] = std::move(t);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

RawTensor convert_tensor(const RawTensor& t, const std::string& dtype) {
  if (t.dtype != "BF16") throw std::runtime_error("convert_tensor expects BF16 input");
  RawTensor out{dtype, t.shape, {}};
  size_t n = t.bytes.size() / 2;
  out.bytes.resize(n * (dtype == "F32" ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
    float f = bf16_to_f32(bits);
    if (dtype == "F32") {
      std::memcpy(out.bytes.data() + 4 * i, &f, 4);
    } else {
      uint16_t h = f32_to_f16(f);
      std::memcpy(out.bytes.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

}  // namespace kettle::test
