// Element types of weights and activations, and their bf16/f16 <-> f32 conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kettle {

enum class DType : uint8_t { kF32, kF16, kBF16 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// The safetensors spelling ("F32", "F16", "BF16"); nullopt for types kettle cannot compute with.
std::optional<DType> dtype_from_safetensors(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as torch does when casting f32 -> bf16.
inline uint16_t f32_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

}  // namespace kettle
