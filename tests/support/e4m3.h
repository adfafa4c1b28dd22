// FP8 e4m3 as the format defines it, for tests (independent of kettle's own decoder
// and of CUDA's conversions): 1 sign bit, 4 exponent bits of bias 7, 3 mantissa bits,
// S.1111.111 NaN, no infinities; the nearest code, ties to the even code.
#pragma once

#include <cmath>
#include <cstdint>

namespace kettle::test {

inline float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (b & 0x80) != 0 ? -v : v;
}

inline uint8_t e4m3_nearest(float v) {
  uint8_t best = 0;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float d = std::abs(e4m3_value(static_cast<uint8_t>(b)) - v), bd = std::abs(e4m3_value(best) - v);
    if (d < bd || (d == bd && (b & 1) == 0 && (best & 1) == 1)) best = static_cast<uint8_t>(b);
  }
  return best;
}

}  // namespace kettle::test
