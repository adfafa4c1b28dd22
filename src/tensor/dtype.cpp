// DType names and sizes; the f16 and e4m3 conversions are tensor/float_bits.h's (portable,
// no F16C needed).
#include "tensor/dtype.h"

#include "tensor/float_bits.h"

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

float f8e4m3_to_f32(uint8_t bits) { return e4m3_bits_to_f32(bits); }
float f16_to_f32(uint16_t h) { return half_bits_to_f32(h); }
uint16_t f32_to_f16(float value) { return f32_to_half_bits(value); }

}  // namespace kettle

