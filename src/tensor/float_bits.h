// Small floating-point formats to and from f32 as bit patterns, for host and device
// alike (util/host_device.h): IEEE f16 (round to nearest even, as torch and CUDA's
// __float2half_rn) and FP8 e4m3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits,
// no infinities, S.1111.111 NaN; encoding saturates at ±448, as CUDA's SATFINITE).
#pragma once

#include <cstdint>
#include <cstring>

#include "util/host_device.h"

namespace kettle {

KETTLE_HD float f32_from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

KETTLE_HD uint32_t f32_bits(float value) {
  uint32_t u;
  memcpy(&u, &value, sizeof u);
  return u;
}

KETTLE_HD float half_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return f32_from_bits(sign);
    int shift = 0;  // subnormal: normalise
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    return f32_from_bits(sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | mantissa << 13);
  }
  if (exponent == 31) return f32_from_bits(sign | 0x7f800000u | mantissa << 13);
  return f32_from_bits(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
}

KETTLE_HD uint16_t f32_to_half_bits(float value) {
  const uint32_t u = f32_bits(value);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((u >> 23) & 0xffu) - 127 + 15;
  uint32_t mantissa = u & 0x7fffffu;
  if (((u >> 23) & 0xffu) == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exponent <= 0) {
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(exponent) << 10 | mantissa >> 13;
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(half);
}

// e4m3 → f32, exactly (the NaN code gives a quiet NaN).
KETTLE_HD float e4m3_bits_to_f32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return f32_from_bits(0x7fc00000u);
  if (exponent == 0) {  // subnormal: m/8 · 2^-6 = m · 2^-9, exact in f32
    if (mantissa == 0) return f32_from_bits(sign);
    return f32_from_bits(sign | f32_bits(static_cast<float>(mantissa) * 0.001953125f));
  }
  return f32_from_bits(sign | (exponent + 127 - 7) << 23 | mantissa << 20);
}

// f32 → the nearest e4m3 code, ties to the even code; ±448 past the range; NaN → NaN.
KETTLE_HD uint8_t f32_to_e4m3_bits(float value) {
  const uint32_t u = f32_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  if (magnitude >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // ≥ 448
  const int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127;
  if (exponent < -6) {  // subnormal codes: multiples of 2^-9, up to 7 · 2^-9 (8 · 2^-9 is the least normal)
    // v in units of 2^-9, rounded to nearest even on the bits shifted out; below 2^-11 it
    // rounds to 0 (and the shift would pass 31).
    if (exponent < -11) return sign;
    const uint32_t m = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(23 - 9 - exponent);  // value = m · 2^(exponent - 23)
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);  // q = 8 is the code of 2^-6: correct
  }
  uint32_t code = static_cast<uint32_t>(exponent + 7) << 3 | (magnitude >> 20 & 0x7u);
  const uint32_t rest = magnitude & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;  // may carry into the exponent: correct
  if (code > 0x7e) code = 0x7e;  // rounded up past 448: saturate
  return static_cast<uint8_t>(sign | code);
}

}  // namespace kettle
