// DType names, sizes and the IEEE half conversions (portable, no F16C needed).
#include "tensor/dtype.h"

#include <cmath>
#include <limits>

namespace kettle {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kU32: return 4;
    case DType::kF8E4M3: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kU32: return "u32";
    case DType::kF8E4M3: return "f8_e4m3";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "U32" || name == "I32") return DType::kU32;  // 32-bit words of packed codes
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return std::nullopt;
}

std::string_view dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kU32: return "U32";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

float f8e4m3_to_f32(uint8_t bits) {
  const float sign = (bits & 0x80) != 0 ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 · 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exponent = static_cast<int32_t>((u >> 23) & 0xffu) - 127 + 15;
  uint32_t mantissa = u & 0x7fffffu;
  if (((u >> 23) & 0xffu) == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exponent <= 0) {
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(exponent) << 10 | mantissa >> 13;
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

}  // namespace kettle

