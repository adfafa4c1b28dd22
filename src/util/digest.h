// Digests for what kettle writes to disk: SHA-256 (FIPS 180-4), which names a
// cached prefix by everything before it (a chain no one can forge a collision
// in), and checksum64, a fast 64-bit hash of bytes that catches a flipped bit
// or a torn write in a header or a tensor (not an adversary).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kettle {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t bytes);
  Sha256& update(std::span<const uint8_t> bytes) { return update(bytes.data(), bytes.size()); }
  Sha256& update(const std::string& text) { return update(text.data(), text.size()); }
  Sha256Digest finish();  // the hasher is spent afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Sha256Digest sha256(const void* data, size_t bytes);
std::string hex(std::span<const uint8_t> bytes);
// 64 lowercase hex digits back into a digest; false when `text` is not that.
bool parse_hex_digest(std::string_view text, Sha256Digest& digest);

// 64 bits over `bytes`, 32 bytes a round in four lanes; equal on every machine.
uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace kettle
