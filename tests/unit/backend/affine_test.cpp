// The affine codec against MLX's layout as its sources spell it out (bytes of a
// 3-, 5- and 6-bit pack, codes read bit by bit), its quantization rule's bounds,
// and cpu_matmul on affine weights against the same matmul of a dense f32
// weight holding the dequantized values (bit for bit, every path, bits and group
// size), with row ranges and thread counts that must not change a bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "tensor/affine_quant.h"

namespace kettle {
namespace {

// Element j's code read bit by bit, the stream taken as bytes (LSB first): the layout
// MLX's extract_bits writes out byte by byte for 3, 5 and 6 bits, and its uint32 packs
// for 2, 4 and 8.
uint32_t code_bit_by_bit(const std::vector<uint32_t>& words, int bits, int64_t j) {
  std::vector<uint8_t> bytes(words.size() * 4);
  std::memcpy(bytes.data(), words.data(), bytes.size());
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = j * bits + b;
    q |= static_cast<uint32_t>((bytes[static_cast<size_t>(bit / 8)] >> (bit % 8)) & 1) << b;
  }
  return q;
}

TEST(AffineCodec, ThreeBitCodesPackAsMlxBytes) {
  // Values -7..0, then zeros, in one group of 32: the end of larger magnitude (-7) is the
  // edge, so scale 1, bias -7, codes 0..7 then 7s. MLX's 3-bit pack puts codes 0-7 in
  // bytes 0x88 0xC6 0xFA (v0 | v1 << 3 | (v2 & 3) << 6, ...).
  std::vector<float> w(32, 0.0f);
  for (int j = 0; j < 8; ++j) w[static_cast<size_t>(j)] = static_cast<float>(j - 7);
  std::vector<uint32_t> codes(3);
  float scale = 0, bias = 0;
  affine_quantize_row(w.data(), 32, 3, 32, codes.data(), &scale, &bias);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(bias, -7.0f);
  std::vector<uint8_t> bytes(12);
  std::memcpy(bytes.data(), codes.data(), 12);
  EXPECT_EQ(bytes[0], 0x88);
  EXPECT_EQ(bytes[1], 0xC6);
  EXPECT_EQ(bytes[2], 0xFA);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(affine_code(codes.data(), 3, j), j < 8 ? static_cast<uint32_t>(j) : 7u);
}

TEST(AffineCodec, CodesAndDequantizationMatchABitByBitReading) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) {
      const int64_t in = 256;
      std::vector<float> w(in), scales(in / group), biases(in / group), out(in);
      for (float& v : w) v = normal(rng);
      std::vector<uint32_t> codes(static_cast<size_t>(in * bits / 32));
      affine_quantize_row(w.data(), in, bits, group, codes.data(), scales.data(), biases.data());
      const AffineRow row{codes.data(), scales.data(), biases.data(), DType::kF32};
      affine_dequantize(row, bits, group, 0, in, out.data());
      for (int64_t j = 0; j < in; ++j) {
        const uint32_t q = code_bit_by_bit(codes, bits, j);
        ASSERT_EQ(affine_code(codes.data(), bits, j), q) << bits << "-bit element " << j;
        ASSERT_LT(q, 1u << bits);
        const float s = scales[static_cast<size_t>(j / group)], b = biases[static_cast<size_t>(j / group)];
        ASSERT_EQ(out[static_cast<size_t>(j)], s * static_cast<float>(q) + b) << bits << "-bit element " << j;
        // Round to nearest: within half a step of the value where it lies inside the
        // codes' range [b, b + s·(2^bits − 1)]; outside (MLX fixes the far end's code, not
        // its value), the nearest end of the range.
        const float v = w[static_cast<size_t>(j)], top = s * static_cast<float>((1 << bits) - 1) + b;
        const float outside = std::max({0.0f, std::min(b, top) - v, v - std::max(b, top)});
        EXPECT_LE(std::abs(out[static_cast<size_t>(j)] - v), 0.5f * std::abs(s) * 1.001f + outside + 1e-6f)
            << bits << "-bit, groups of " << group << ", element " << j;
      }
      // A part of a row: the same values as the whole row's.
      std::vector<float> part(64);
      affine_dequantize(row, bits, group, 128, 64, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), out.data() + 128, 64 * sizeof(float)));
    }
  }
}

TEST(AffineCodec, TheEdgeOfLargerMagnitudeIsExact) {
  // MLX's rule: the end of the range farther from zero is exactly a code's value, and a
  // group of one repeated value comes back exactly.
  std::vector<float> w(64);
  for (int j = 0; j < 64; ++j) w[static_cast<size_t>(j)] = -3.0f + 0.01f * static_cast<float>(j);
  w[5] = 0.75f;
  std::vector<uint32_t> codes(8);
  float s = 0, b = 0;
  affine_quantize_row(w.data(), 64, 4, 64, codes.data(), &s, &b);
  EXPECT_EQ(b, -3.0f);
  EXPECT_EQ(s * static_cast<float>(affine_code(codes.data(), 4, 0)) + b, -3.0f);
  std::vector<float> flat(32, 0.25f), back(32);
  std::vector<uint32_t> flat_codes(2);
  affine_quantize_row(flat.data(), 32, 2, 32, flat_codes.data(), &s, &b);
  affine_dequantize({flat_codes.data(), &s, &b, DType::kF32}, 2, 32, 0, 32, back.data());
  for (float v : back) EXPECT_EQ(v, 0.25f);
}

TEST(AffineCodec, LeastSquaresFitsNoWorseThanMlxsRule) {
  // Per group, the least-squares choice (stored in f32 here) never has more squared error
  // than MLX's, and over many groups clearly less.
  std::mt19937 rng(5);
  std::student_t_distribution<float> heavy(4.0f);  // weights have outliers
  double mlx_total = 0, ls_total = 0;
  for (int bits : {2, 3, 4, 8}) {
    const int64_t in = 64 * 32;
    std::vector<float> w(in), s1(32), b1(32), s2(32), b2(32), d1(in), d2(in);
    for (float& v : w) v = 0.02f * heavy(rng);
    std::vector<uint32_t> c1(static_cast<size_t>(in * bits / 32)), c2(c1.size());
    affine_quantize_row(w.data(), in, bits, 64, c1.data(), s1.data(), b1.data(), AffineFit::kMlx);
    affine_quantize_row(w.data(), in, bits, 64, c2.data(), s2.data(), b2.data(), AffineFit::kLeastSquares, DType::kF32);
    affine_dequantize({c1.data(), s1.data(), b1.data(), DType::kF32}, bits, 64, 0, in, d1.data());
    affine_dequantize({c2.data(), s2.data(), b2.data(), DType::kF32}, bits, 64, 0, in, d2.data());
    for (int64_t g = 0; g < 32; ++g) {
      double e1 = 0, e2 = 0;
      for (int64_t j = g * 64; j < (g + 1) * 64; ++j) {
        e1 += std::pow(d1[static_cast<size_t>(j)] - w[static_cast<size_t>(j)], 2);
        e2 += std::pow(d2[static_cast<size_t>(j)] - w[static_cast<size_t>(j)], 2);
      }
      EXPECT_LE(e2, e1 * (1 + 1e-6) + 1e-12) << bits << "-bit group " << g;
      if (bits == 4) mlx_total += e1, ls_total += e2;
    }
  }
  EXPECT_LT(ls_total, 0.95 * mlx_total);
}

// A random [m, k] weight quantized, its scales and biases in bf16 as a checkpoint holds
// them, and the dense f32 weight of the values they stand for.
struct AffineWeight {
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
  std::vector<float> dense;
  AffineScales parts;
  Tensor tensor;
};

AffineWeight make_affine(int64_t m, int64_t k, int bits, int group, std::mt19937& rng) {
  AffineWeight a;
  std::normal_distribution<float> normal(0.0f, 0.1f);
  const int64_t groups = k / group;
  a.codes.resize(static_cast<size_t>(m * k * bits / 32));
  a.scales.resize(static_cast<size_t>(m * groups));
  a.biases.resize(static_cast<size_t>(m * groups));
  a.dense.resize(static_cast<size_t>(m * k));
  std::vector<float> row(static_cast<size_t>(k)), s(static_cast<size_t>(groups)), b(static_cast<size_t>(groups));
  for (int64_t r = 0; r < m; ++r) {
    for (float& v : row) v = normal(rng);
    uint32_t* codes = a.codes.data() + r * k * bits / 32;
    affine_quantize_row(row.data(), k, bits, group, codes, s.data(), b.data());
    for (int64_t g = 0; g < groups; ++g) {
      a.scales[static_cast<size_t>(r * groups + g)] = f32_to_bf16(s[static_cast<size_t>(g)]);
      a.biases[static_cast<size_t>(r * groups + g)] = f32_to_bf16(b[static_cast<size_t>(g)]);
    }
    std::vector<uint32_t> row_codes(codes, codes + k * bits / 32);
    for (int64_t j = 0; j < k; ++j) {
      const float sc = bf16_to_f32(a.scales[static_cast<size_t>(r * groups + j / group)]);
      const float bi = bf16_to_f32(a.biases[static_cast<size_t>(r * groups + j / group)]);
      a.dense[static_cast<size_t>(r * k + j)] = sc * static_cast<float>(code_bit_by_bit(row_codes, bits, j)) + bi;
    }
  }
  a.parts.scales = Tensor{a.scales.data(), DType::kBF16, {m, groups}};
  a.parts.biases = Tensor{a.biases.data(), DType::kBF16, {m, groups}};
  a.parts.bits = bits;
  a.parts.group_size = group;
  a.tensor = Tensor{a.codes.data(), DType::kU32, {m, k * bits / 32}};
  return a;
}

TEST(AffineMatmul, EqualsTheDenseMatmulOfTheDequantizedWeightsOnEveryPath) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (MatmulPath path : {MatmulPath::kGeneric, MatmulPath::kAvx2, MatmulPath::kAvx512, MatmulPath::kBlas}) {
    if (!matmul_path_available(path)) continue;
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int group : {32, 64, 128}) {
        const int64_t m = 40, k = 384;
        AffineWeight a = make_affine(m, k, bits, group, rng);
        const Tensor dense{a.dense.data(), DType::kF32, {m, k}};
        std::vector<float> bias(static_cast<size_t>(m));
        for (float& v : bias) v = normal(rng);
        const Tensor bias_t{bias.data(), DType::kF32, {m}};
        for (int64_t n : {1, 3, 17}) {
          std::vector<float> x(static_cast<size_t>(n * k));
          for (float& v : x) v = normal(rng);
          for (int threads : {1, 3}) {
            ThreadPool pool(threads);
            std::vector<float> want(static_cast<size_t>(n * m), NAN), got(static_cast<size_t>(n * m), NAN);
            cpu_matmul_on(path, pool, x.data(), n, k, dense, &bias_t, want.data(), m);
            const MatmulTarget target{&a.tensor, &bias_t, got.data(), m, &a.parts};
            cpu_matmul_many_on(path, pool, x.data(), n, k, &target, 1);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                << matmul_path_name(path) << " " << bits << "-bit groups of " << group << " n=" << n
                << " threads=" << threads;
          }
        }
      }
    }
  }
}

TEST(AffineMatmul, MixesWithDenseTargetsInOneCall) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 256, n = 5;
  AffineWeight a = make_affine(24, k, 4, 64, rng);
  std::vector<float> dense_w(static_cast<size_t>(8 * k));
  for (float& v : dense_w) v = normal(rng);
  const Tensor dense_t{dense_w.data(), DType::kF32, {8, k}}, deq{a.dense.data(), DType::kF32, {24, k}};
  std::vector<float> x(static_cast<size_t>(n * k));
  for (float& v : x) v = normal(rng);
  ThreadPool pool(2);
  std::vector<float> q_out(n * 24), d_out(n * 8), q_want(n * 24), d_want(n * 8);
  const MatmulTarget both[] = {{&a.tensor, nullptr, q_out.data(), 24, &a.parts}, {&dense_t, nullptr, d_out.data(), 8}};
  cpu_matmul_many(pool, x.data(), n, k, both, 2);
  cpu_matmul(pool, x.data(), n, k, deq, nullptr, q_want.data(), 24);
  cpu_matmul(pool, x.data(), n, k, dense_t, nullptr, d_want.data(), 8);
  if (choose_matmul_path(n, DType::kU32) == MatmulPath::kAvx512Bf16) {  // 4-bit: BF16 dot products
    for (size_t i = 0; i < q_out.size(); ++i) EXPECT_NEAR(q_out[i], q_want[i], 1e-4f * (1 + std::abs(q_want[i])));
  } else {
    EXPECT_EQ(q_out, q_want);
  }
  EXPECT_EQ(d_out, d_want);
}

// The BF16 kernel (4-bit weights, x as bf16 hi + lo): within the last bits of the dense f32
// matmul of the dequantized weights, and the same bits for a row alone, in any batch and
// on any number of threads; other bit widths on this path are the AVX-512 kernels' own.
TEST(AffineMatmul, Bf16KernelIsTheDenseMatmulToTheLastBitsAndBatchInvariant) {
  if (!matmul_path_available(MatmulPath::kAvx512Bf16)) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128, 0}) {
      // m: tiles of 4 rows and a remainder; groups: 16 a vector, and more. group 0: groups
      // of 32 with k an odd multiple of 32 (the kernel's last block of 64 is half full).
      const int64_t m = 44, k = group == 0 ? 608 : 640, n = 19;
      if (group == 0) group = 32;
      AffineWeight a = make_affine(m, k, bits, group, rng);
      const Tensor dense{a.dense.data(), DType::kF32, {m, k}};
      std::vector<float> bias(static_cast<size_t>(m));
      for (float& v : bias) v = normal(rng);
      const Tensor bias_t{bias.data(), DType::kF32, {m}};
      std::vector<float> x(static_cast<size_t>(n * k));
      for (float& v : x) v = normal(rng);
      const auto run = [&](const float* xs, int64_t rows, int threads) {
        ThreadPool pool(threads);
        std::vector<float> out(static_cast<size_t>(rows * m), NAN);
        const MatmulTarget target{&a.tensor, &bias_t, out.data(), m, &a.parts};
        cpu_matmul_many_on(MatmulPath::kAvx512Bf16, pool, xs, rows, k, &target, 1);
        return out;
      };
      ThreadPool pool(2);
      std::vector<float> want(static_cast<size_t>(n * m));
      cpu_matmul_on(MatmulPath::kAvx512, pool, x.data(), n, k, dense, &bias_t, want.data(), m);
      const std::vector<float> all = run(x.data(), n, 2);
      const std::string label = std::to_string(bits) + "-bit, groups of " + std::to_string(group) + ", k " + std::to_string(k);
      if (bits != 4) {
        EXPECT_EQ(all, want) << label;
        continue;
      }
      double err = 0, norm = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        err += (all[i] - want[i]) * static_cast<double>(all[i] - want[i]);
        norm += want[i] * static_cast<double>(want[i]);
      }
      EXPECT_LE(std::sqrt(err / norm), 2e-5) << label;
      for (int64_t t = 0; t < n; ++t) {
        const std::vector<float> alone = run(x.data() + t * k, 1, t % 2 + 1);
        ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + t * m, static_cast<size_t>(m) * sizeof(float)))
            << label << ", token row " << t;
      }
      EXPECT_EQ(run(x.data(), n, 3), all) << label << ", 3 threads";
    }
  }
}

}  // namespace
}  // namespace kettle
