// convert_to_f32 on every ISA path against an independent decode of the bf16
// and f16 bit fields, exhaustively over all 65536 encodings and odd lengths.
#include "backend/cpu/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"

namespace kettle {
namespace {

// IEEE binary16 by its definition, in double: no shared code with dtype.cpp.
double f16_reference(uint16_t h) {
  int sign = (h >> 15) ? -1 : 1;
  int exponent = (h >> 10) & 0x1f;
  int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// bfloat16 is the top half of a binary32: sign, 8-bit exponent, 7-bit mantissa.
double bf16_reference(uint16_t b) {
  int sign = (b >> 15) ? -1 : 1;
  int exponent = (b >> 7) & 0xff;
  int mantissa = b & 0x7f;
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);
  if (exponent == 255) return mantissa == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

void expect_same(double want, float got, uint16_t bits) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "bits 0x" << std::hex << bits;
  } else {
    EXPECT_EQ(want, static_cast<double>(got)) << "bits 0x" << std::hex << bits;
    EXPECT_EQ(std::signbit(want), std::signbit(got)) << "bits 0x" << std::hex << bits;
  }
}

class ConvertTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    CpuIsa isa = GetParam();
    if (isa == CpuIsa::kAvx512 && !cpu_features().avx512)
      GTEST_SKIP() << "this CPU lacks AVX-512 (f, bw, vl, dq); the avx512 path is not tested";
    if (isa == CpuIsa::kAvx2 && !cpu_features().avx2_fma_f16c)
      GTEST_SKIP() << "this CPU lacks AVX2+FMA+F16C; the avx2 path is not tested";
    set_cpu_isa_cap(isa);
    ASSERT_EQ(best_cpu_isa(), isa);
  }
  void TearDown() override { set_cpu_isa_cap(CpuIsa::kAvx512); }
};

TEST_P(ConvertTest, EveryHalfEncoding) {
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  std::vector<float> out(bits.size());
  convert_to_f32(bits.data(), DType::kF16, out.data(), static_cast<int64_t>(bits.size()));
  for (size_t i = 0; i < bits.size(); ++i) expect_same(f16_reference(bits[i]), out[i], bits[i]);
  convert_to_f32(bits.data(), DType::kBF16, out.data(), static_cast<int64_t>(bits.size()));
  for (size_t i = 0; i < bits.size(); ++i) expect_same(bf16_reference(bits[i]), out[i], bits[i]);
}

TEST_P(ConvertTest, OddLengthsWriteExactlyN) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100}) {
      // Source values from an arithmetic sequence that every dtype holds exactly.
      std::vector<uint16_t> half(static_cast<size_t>(n));
      std::vector<float> full(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        float v = static_cast<float>(i - 50) * 0.25f;
        full[i] = v;
        half[i] = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
      std::vector<float> out(static_cast<size_t>(n) + 8, NAN);
      const void* src = dtype == DType::kF32 ? static_cast<const void*>(full.data()) : half.data();
      convert_to_f32(src, dtype, out.data(), n);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(out[i], static_cast<float>(i - 50) * 0.25f) << dtype_name(dtype) << " n=" << n;
      for (int64_t i = n; i < n + 8; ++i)
        EXPECT_TRUE(std::isnan(out[i])) << "wrote past n=" << n << " for " << dtype_name(dtype);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, ConvertTest, ::testing::Values(CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace kettle
