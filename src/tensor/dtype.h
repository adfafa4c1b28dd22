// Element types of weights and activations, and their bf16/f16 <-> f32 conversions.
// kU32 is storage only: the packed codes of a quantized weight (tensor/affine_quant.h),
// never read as numbers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kettle {

enum class DType : uint8_t { kF32, kF16, kBF16, kU32 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// f32, f16 or bf16: a type arithmetic reads.
inline bool dtype_is_float(DType dtype) { return dtype != DType::kU32; }
// The safetensors spelling ("F32", "F16", "BF16"; "U32" and "I32" as packed words); nullopt for
// types kettle cannot use.
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view dtype_safetensors_name(DType dtype);

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
