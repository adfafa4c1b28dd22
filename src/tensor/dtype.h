// Element types of weights and activations, and their bf16/f16 <-> f32 conversions.
// kU32 and kF8E4M3 are storage only: the packed codes of a quantized weight
// (tensor/affine_quant.h) and FP8 weights, widened by the model's loader before any
// arithmetic reads them.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kettle {

enum class DType : uint8_t { kF32, kF16, kBF16, kU32, kF8E4M3 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// f32, f16 or bf16: a type arithmetic reads.
inline bool dtype_is_float(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

// An FP8 e4m3 value (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN) as f32, exactly.
float f8e4m3_to_f32(uint8_t bits);
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

// Element i of an f32, f16 or bf16 array as f32 (0 for the storage-only types).
inline float dtype_value(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kU32:
    case DType::kF8E4M3: break;
  }
  return 0.0f;
}

}  // namespace kettle
