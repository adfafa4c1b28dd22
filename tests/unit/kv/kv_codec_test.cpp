// The KV cache's codecs (tensor/kv_codec.h) against double-precision references
// written here: the f16 and e4m3 roundings, each group codec's codes and
// parameters, the rotation as a matrix product, and each codec's round-trip
// error on Gaussian rows within its bound.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kv/kv_quant.h"
#include "support/e4m3.h"
#include "support/random_values.h"
#include "tensor/kv_codec.h"
#include "util/error.h"

namespace kettle {
namespace {

using test::gaussian_values;
std::vector<float> gaussian(size_t n, uint64_t seed, float scale = 1.0f) { return gaussian_values(n, seed, scale); }

KvRowCodec fp8_codec() {
  KvRowCodec c;
  c.format = KvRowCodec::Format::kFp8;
  c.bits = 8;
  c.group = 64;
  return c;
}

KvRowCodec lloyd_codec(int bits, int rotation) {
  KvRowCodec c;
  c.format = KvRowCodec::Format::kLloydMax;
  c.bits = bits;
  c.group = 32;
  c.rotation = rotation;
  return c;
}

// The f16 nearest to v (ties to the even code), by search over the codes around it.
uint16_t nearest_half(float v) {
  const uint16_t guess = f32_to_half_bits(v);
  uint16_t best = guess;
  for (int d = -2; d <= 2; ++d) {
    const auto c = static_cast<uint16_t>(guess + d);
    if ((c & 0x7c00) == 0x7c00) continue;  // inf / NaN
    const double e = std::abs(static_cast<double>(half_bits_to_f32(c)) - v),
                 be = std::abs(static_cast<double>(half_bits_to_f32(best)) - v);
    if (e < be || (e == be && (c & 1) == 0)) best = c;
  }
  return best;
}

TEST(KvCodec, HalfRoundsToNearestEven) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-24, 15);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    EXPECT_EQ(f32_to_half_bits(v), nearest_half(v)) << v;
  }
  EXPECT_EQ(f32_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie to the even code
  EXPECT_EQ(f32_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(half_bits_to_f32(0x3555), static_cast<float>(0x155 + 1024) / 1024.0f / 4.0f);
}

TEST(KvCodec, E4m3RoundsToNearestEvenAndSaturates) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 9);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    uint8_t want = std::abs(v) >= 448.0f ? static_cast<uint8_t>((v < 0 ? 0x80 : 0) | 0x7e) : test::e4m3_nearest(v);
    if (want == 0 && v < 0) want = 0x80;  // a negative value too small for a code keeps its sign (−0), as CUDA's
    ASSERT_EQ(f32_to_e4m3_bits(v), want) << v;
  }
  for (int code = 0; code < 256; ++code) {  // every code decodes to its value, and encodes back
    if ((code & 0x7f) == 0x7f) continue;
    const float v = e4m3_bits_to_f32(static_cast<uint8_t>(code));
    EXPECT_EQ(v, test::e4m3_value(static_cast<uint8_t>(code))) << code;
    EXPECT_EQ(f32_to_e4m3_bits(v), code) << code;
  }
  // Midpoints between neighbours: ties go to the even code.
  for (int code = 1; code < 0x7e; ++code) {
    const float mid = 0.5f * (test::e4m3_value(static_cast<uint8_t>(code)) + test::e4m3_value(static_cast<uint8_t>(code + 1)));
    EXPECT_EQ(f32_to_e4m3_bits(mid), code % 2 == 0 ? code : code + 1) << code;
  }
}

TEST(KvCodec, AffineCodesAreTheRoundedOffsetsOfTheF16Parameters) {
  for (int bits : {4, 8}) {
    const KvRowCodec c = kv_affine_codec(bits, 64);
    const auto x = gaussian(64 * 8, 3, 2.0f);
    std::vector<uint8_t> row(c.row_bytes(static_cast<int64_t>(x.size())));
    kv_encode_row(c, x.data(), static_cast<int64_t>(x.size()), 128, row.data());
    const double max_q = (1 << bits) - 1;
    for (int64_t g = 0; g < 8; ++g) {
      double lo = x[g * 64], hi = lo;
      for (int i = 0; i < 64; ++i) lo = std::min<double>(lo, x[g * 64 + i]), hi = std::max<double>(hi, x[g * 64 + i]);
      uint16_t s16, b16;
      std::memcpy(&s16, row.data() + c.code_bytes(512) + g * 4, 2);
      std::memcpy(&b16, row.data() + c.code_bytes(512) + g * 4 + 2, 2);
      EXPECT_EQ(s16, nearest_half(static_cast<float>((hi - lo) / max_q)));
      EXPECT_EQ(b16, nearest_half(static_cast<float>(lo)));
      const double s = half_bits_to_f32(s16), b = half_bits_to_f32(b16);
      for (int i = 0; i < 64; ++i) {
        const int64_t e = g * 64 + i;
        const double q = std::clamp(std::nearbyint((x[e] - b) / s), 0.0, max_q);
        EXPECT_EQ(kv_code(row.data(), e * bits, bits), static_cast<uint32_t>(q)) << bits << " bits, element " << e;
        EXPECT_EQ(kv_decode(c, row.data(), 512, e), static_cast<float>(s * q + b));
      }
    }
  }
}

TEST(KvCodec, Fp8CodesAreTheNearestE4m3OfTheScaledValues) {
  const KvRowCodec c = fp8_codec();
  const auto x = gaussian(256, 4, 3.0f);
  std::vector<uint8_t> row(c.row_bytes(256));
  kv_encode_row(c, x.data(), 256, 64, row.data());
  for (int64_t g = 0; g < 4; ++g) {
    double amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::max<double>(amax, std::abs(x[g * 64 + i]));
    float s;
    std::memcpy(&s, row.data() + c.code_bytes(256) + g * 4, 4);
    EXPECT_EQ(s, static_cast<float>(amax) / 448.0f);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(row[g * 64 + i], test::e4m3_nearest(x[g * 64 + i] / s)) << g * 64 + i;
  }
}

TEST(KvCodec, LloydMaxCodesAreTheNearestCentroidsAtTheGroupsRms) {
  for (int bits : {2, 3, 4}) {
    const KvRowCodec c = lloyd_codec(bits, 0);
    const auto x = gaussian(128, 5 + bits, 0.7f);
    std::vector<uint8_t> row(c.row_bytes(128));
    kv_encode_row(c, x.data(), 128, 128, row.data());
    for (int64_t g = 0; g < 4; ++g) {
      double squares = 0;
      for (int i = 0; i < 32; ++i) squares += static_cast<double>(x[g * 32 + i]) * x[g * 32 + i];
      uint16_t r16;
      std::memcpy(&r16, row.data() + c.code_bytes(128) + g * 2, 2);
      EXPECT_NEAR(half_bits_to_f32(r16), std::sqrt(squares / 32), std::sqrt(squares / 32) * 1e-3);
      const double r = half_bits_to_f32(r16);
      for (int i = 0; i < 32; ++i) {
        const double u = x[g * 32 + i] / r;
        int best = 0;
        for (int q = 1; q < (1 << bits); ++q)
          if (std::abs(u - kv_lloyd_level(bits, q)) < std::abs(u - kv_lloyd_level(bits, best))) best = q;
        EXPECT_EQ(kv_code(row.data(), (g * 32 + i) * bits, bits), static_cast<uint32_t>(best)) << bits << " bits";
      }
    }
  }
}

// A head of n channels in Hadamard blocks of `block`: y_i = Σ_j H[i][j] · sign_j · x_j / √block
// over j in i's block, H[i][j] = (−1)^popcount(i & j).
TEST(KvCodec, TheRotationIsTheSignedHadamardMatrixScaled) {
  for (const auto& [n, block] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{256, 256}, std::pair{96, 32}}) {
    auto x = gaussian(static_cast<size_t>(n), 6);
    std::vector<float> y = x;
    kv_rotate(y.data(), n, block);
    double norm_x = 0, norm_y = 0;
    for (int i = 0; i < n; ++i) {
      double want = 0;
      const int first = i / block * block;
      for (int j = first; j < first + block; ++j)
        want += (std::popcount(static_cast<unsigned>((i - first) & (j - first))) % 2 ? -1.0 : 1.0) *
                (kv_rotation_flips(j) ? -1.0 : 1.0) * x[j];
      want /= std::sqrt(static_cast<double>(block));
      EXPECT_NEAR(y[i], want, 1e-5) << n << ", " << i;
      norm_x += static_cast<double>(x[i]) * x[i], norm_y += static_cast<double>(y[i]) * y[i];
    }
    EXPECT_NEAR(norm_y, norm_x, 1e-4 * norm_x);
    kv_unrotate(y.data(), n, block);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  }
}

// Relative RMS error of a row round trip, the codecs on Gaussian keys and values.
double round_trip_error(const KvRowCodec& c, const std::vector<float>& x, int head_dim) {
  const auto width = static_cast<int64_t>(x.size());
  std::vector<uint8_t> row(c.row_bytes(width));
  kv_encode_row(c, x.data(), width, head_dim, row.data());
  std::vector<float> back(x.size());
  kv_decode_span(c, row.data(), width, 0, width, back.data());
  if (c.rotation > 0)
    for (int64_t h = 0; h * head_dim < width; ++h) kv_unrotate(back.data() + h * head_dim, head_dim, c.rotation);
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) d += (back[i] - x[i]) * (back[i] - x[i]), n += x[i] * x[i];
  return std::sqrt(d / n);
}

TEST(KvCodec, EachCodecRoundTripsWithinItsBound) {
  const auto x = gaussian(8 * 128, 7);
  EXPECT_LT(round_trip_error(kv_affine_codec(8, 64), x, 128), 0.006);
  EXPECT_LT(round_trip_error(kv_affine_codec(4, 64), x, 128), 0.10);
  EXPECT_LT(round_trip_error(kv_affine_codec(8, 32), x, 128), 0.005);
  EXPECT_LT(round_trip_error(fp8_codec(), x, 128), 0.04);
  EXPECT_LT(round_trip_error(lloyd_codec(3, 128), x, 128), 0.20);  // Lloyd-Max 3 bits: √0.0345 ≈ 0.186
  EXPECT_LT(round_trip_error(lloyd_codec(4, 128), x, 128), 0.11);
  EXPECT_LT(round_trip_error(lloyd_codec(2, 128), x, 128), 0.36);
  EXPECT_LT(round_trip_error(lloyd_codec(3, 32), x, 128), 0.20);
}

TEST(KvCodec, ZeroBytesDecodeToZeros) {
  for (const KvRowCodec& c : {kv_affine_codec(8, 64), kv_affine_codec(4, 64), fp8_codec(), lloyd_codec(3, 128)}) {
    std::vector<uint8_t> row(c.row_bytes(128), 0);
    std::vector<float> out(128, 1.0f);
    kv_decode_span(c, row.data(), 128, 0, 128, out.data());
    for (float v : out) EXPECT_EQ(v, 0.0f) << kv_codec_name(c);
  }
}

// The CUDA attention reads rows 16 elements at a time (KvPiece): each piece's values are
// the element-wise decode's, bit for bit, for every codec and width it applies to; widths
// whose pieces would be misaligned are left to the 8-element path.
TEST(KvCodec, PiecesDecodeAsTheElementsDo) {
  std::vector<KvRowCodec> codecs = {kv_affine_codec(8, 64), kv_affine_codec(4, 64), kv_affine_codec(8, 32),
                                    kv_affine_codec(4, 16), fp8_codec(),           lloyd_codec(3, 64),
                                    lloyd_codec(2, 64),     lloyd_codec(4, 64)};
  for (const KvRowCodec& c : codecs) {
    for (const int64_t width : {int64_t{8 * 128}, int64_t{4 * 64}, int64_t{2 * 128}}) {
      const int head_dim = width == 4 * 64 ? 64 : 128;
      ASSERT_TRUE(kv_pieces_fit(c, width, head_dim)) << kv_codec_name(c) << " width " << width;
      const auto x = gaussian(static_cast<size_t>(width), 11, 3.0f);
      std::vector<uint8_t> row(c.row_bytes(width));
      kv_encode_row(c, x.data(), width, head_dim, row.data());
      for (int64_t p = 0; p < width / 16; ++p) {
        float got[16];
        kv_decode_piece(c, kv_load_piece(c, row.data(), width, p), got);
        for (int e = 0; e < 16; ++e)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[e]), std::bit_cast<uint32_t>(kv_decode(c, row.data(), width, p * 16 + e)))
              << kv_codec_name(c) << " element " << p * 16 + e;
      }
    }
  }
  EXPECT_FALSE(kv_pieces_fit(kv_affine_codec(8, 8), 1024, 128));  // groups smaller than a piece
  EXPECT_FALSE(kv_pieces_fit(kv_affine_codec(8, 64), 1000, 125));  // heads of partial pieces
  EXPECT_FALSE(kv_pieces_fit(kv_affine_codec(8, 64), 128, 128));   // rows of 136 bytes: codes not 16-byte aligned
}

// The bytes: per token, against f16 rows (2 bytes an element, keys and values).
TEST(KvCodec, RowBytesAgainstF16) {
  const int64_t width = 8 * 128;
  const double f16 = 2.0 * 2 * width;
  const auto ratio = [&](const KvQuant& q) {
    const KvCodec c = q.codec_for(0, KvLayer::Kind::kFull, 128, DType::kF16);
    return static_cast<double>(c.key.row_bytes(width) + c.value.row_bytes(width)) / f16;
  };
  EXPECT_NEAR(ratio(parse_kv_quant("8")), 68.0 / 128, 1e-12);
  EXPECT_LE(ratio(parse_kv_quant("4")), 0.30);
  EXPECT_LE(ratio(parse_kv_quant("turbo")), 0.40);
  EXPECT_EQ(ratio(parse_kv_quant("off")), 1.0);
  // Sliding-window layers keep the plain type under turbo.
  const KvCodec window = parse_kv_quant("turbo").codec_for(0, KvLayer::Kind::kWindow, 128, DType::kF16);
  EXPECT_FALSE(window.key.quantized() || window.value.quantized());
}

TEST(KvCodec, PolicySpellings) {
  EXPECT_EQ(parse_kv_quant("turbo").name(), "turbo:k8v3");
  EXPECT_EQ(parse_kv_quant("turbo:k4v2").name(), "turbo:k4v2");
  EXPECT_EQ(parse_kv_quant("fp8").name(), "fp8");
  for (const char* bad : {"5", "turbo:k8", "turbo:k9v3", "turbo:k8v5", "turbo:k8v3x", "int8", ""}) {
    try {
      parse_kv_quant(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-quant"), std::string::npos) << e.what();
    }
  }
  // Heads of other widths take the widest group that divides them (groups never straddle
  // heads) and rotate in the largest power-of-two blocks that do; none at all is refused.
  EXPECT_EQ(parse_kv_quant("8").codec_for(3, KvLayer::Kind::kFull, 96, DType::kF32).key.group, 32);
  EXPECT_EQ(parse_kv_quant("4").codec_for(3, KvLayer::Kind::kFull, 80, DType::kF32).key.group, 16);
  EXPECT_EQ(parse_kv_quant("fp8").codec_for(3, KvLayer::Kind::kFull, 256, DType::kF32).key.group, 64);
  const KvCodec turbo96 = parse_kv_quant("turbo").codec_for(3, KvLayer::Kind::kFull, 96, DType::kF32);
  EXPECT_EQ(turbo96.value.group, 32);
  EXPECT_EQ(turbo96.value.rotation, 32);
  EXPECT_EQ(parse_kv_quant("turbo").codec_for(3, KvLayer::Kind::kFull, 128, DType::kF32).value.rotation, 128);
  EXPECT_THROW(parse_kv_quant("8").codec_for(3, KvLayer::Kind::kFull, 20, DType::kF32), Error);
}

}  // namespace
}  // namespace kettle
