// cpu_matmul on every path (generic, avx2, avx512, openblas) against a naive
// double-precision reference: every weight and bias dtype, ragged shapes,
// padded row strides, NaN-poisoned outputs, and thread-count independence.
#include "backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "util/error.h"

namespace kettle {
namespace {

constexpr double kTolerance = 1e-5;

// A weight (or bias) in some dtype, with the exact values it holds as doubles.
struct Weights {
  std::vector<uint16_t> half;
  std::vector<float> full;
  std::vector<double> exact;
  Tensor tensor;
};

Weights make_weights(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  Weights w;
  int64_t count = 1;
  for (auto d : shape) count *= d;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  w.exact.resize(static_cast<size_t>(count));
  if (dtype == DType::kF32) {
    w.full.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) w.exact[i] = w.full[i] = dist(rng);
    w.tensor = Tensor{w.full.data(), dtype, shape};
  } else {
    w.half.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      float v = dist(rng);
      w.half[i] = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      w.exact[i] = dtype == DType::kBF16 ? bf16_to_f32(w.half[i]) : f16_to_f32(w.half[i]);
    }
    w.tensor = Tensor{w.half.data(), dtype, shape};
  }
  return w;
}

struct Shape {
  int64_t n, k, m;
  int64_t x_pad = 0, out_pad = 0;  // ldx = k + x_pad, ldo = m + out_pad
};

std::string describe(MatmulPath path, DType dtype, const Shape& s, const char* bias) {
  return std::string(matmul_path_name(path)) + " " + std::string(dtype_name(dtype)) + " n=" + std::to_string(s.n) +
         " k=" + std::to_string(s.k) + " m=" + std::to_string(s.m) + " ldx=" + std::to_string(s.k + s.x_pad) +
         " ldo=" + std::to_string(s.m + s.out_pad) + " bias=" + bias;
}

// Runs one matmul and checks it against the double reference, row by row.
void check_matmul(MatmulPath path, ThreadPool& pool, DType dtype, const Shape& s, const DType* bias_dtype,
                  std::mt19937& rng) {
  Weights w = make_weights(dtype, {s.m, s.k}, rng);
  Weights b;
  if (bias_dtype != nullptr) b = make_weights(*bias_dtype, {s.m}, rng);
  int64_t ldx = s.k + s.x_pad, ldo = s.m + s.out_pad;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(s.n * ldx), NAN);  // padding must not be read
  for (int64_t t = 0; t < s.n; ++t)
    for (int64_t i = 0; i < s.k; ++i) x[t * ldx + i] = normal(rng);
  std::vector<float> out(static_cast<size_t>(s.n * ldo), NAN);

  cpu_matmul_on(path, pool, x.data(), s.n, ldx, w.tensor, bias_dtype ? &b.tensor : nullptr, out.data(), ldo);

  std::string what = describe(path, dtype, s, bias_dtype ? dtype_name(*bias_dtype).data() : "none");
  for (int64_t t = 0; t < s.n; ++t) {
    double err2 = 0, ref2 = 0, magnitude2 = 0;
    for (int64_t r = 0; r < s.m; ++r) {
      double ref = bias_dtype ? b.exact[r] : 0.0;
      double magnitude = std::fabs(ref);
      for (int64_t i = 0; i < s.k; ++i) {
        double term = static_cast<double>(x[t * ldx + i]) * w.exact[r * s.k + i];
        ref += term;
        magnitude += std::fabs(term);
      }
      double got = out[t * ldo + r];
      ASSERT_FALSE(std::isnan(got)) << what << ": out[" << t << ", " << r << "] not written";
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
      magnitude2 += magnitude * magnitude;
    }
    // Relative error ≤ 1e-5, except where the exact row cancels to under 1% of
    // its terms' magnitude (a lone output, m = 1, can): no f32 sum is accurate
    // relative to such a row, so it is held to 1e-7 of the magnitude instead.
    double scale = std::max(std::sqrt(ref2), std::sqrt(magnitude2) / 100);
    ASSERT_LE(std::sqrt(err2), kTolerance * scale) << what << ": row " << t << " (|ref| " << std::sqrt(ref2) << ")";
    for (int64_t r = s.m; r < ldo; ++r)
      ASSERT_TRUE(std::isnan(out[t * ldo + r])) << what << ": wrote out[" << t << ", " << r << "] past m";
  }
}

class MatmulTest : public ::testing::TestWithParam<MatmulPath> {
 protected:
  void SetUp() override {
    MatmulPath path = GetParam();
    if (path == MatmulPath::kAvx512 && !matmul_path_available(path))
      GTEST_SKIP() << "this CPU lacks AVX-512 (f, bw, vl, dq); the avx512 path is not tested";
    if (path == MatmulPath::kAvx2 && !matmul_path_available(path))
      GTEST_SKIP() << "this CPU lacks AVX2+FMA+F16C; the avx2 path is not tested";
  }
};

TEST_P(MatmulTest, RaggedShapesEveryDtype) {
  ThreadPool pool(1);
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  const int64_t ms[] = {1, 5, 37, 67, 9};
  int variant = 0;
  for (DType dtype : dtypes) {
    for (int64_t n : {1, 2, 3, 5, 8, 17, 64, 130}) {
      for (int64_t k : {1, 7, 16, 33, 100, 257}) {
        Shape s{n, k, ms[variant % 5], variant % 3 == 0 ? 0 : 5, variant % 2 == 0 ? 0 : 3};
        int bias_choice = variant % 4;  // none, bf16, f16, f32
        const DType* bias = bias_choice == 0 ? nullptr : &dtypes[bias_choice - 1];
        check_matmul(GetParam(), pool, dtype, s, bias, rng);
        ++variant;
      }
    }
  }
}

// Long k and many tokens: several k-blocks (partial sums added into out) and
// several token blocks, with a bias that only the first k-block may add.
TEST_P(MatmulTest, BlockedShapes) {
  ThreadPool pool(1);
  std::mt19937 rng(99);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    DType bias_dtype = DType::kBF16;
    check_matmul(GetParam(), pool, dtype, Shape{130, 4111, 45, 1, 2}, &bias_dtype, rng);
    check_matmul(GetParam(), pool, dtype, Shape{3, 4111, 29, 0, 0}, nullptr, rng);
  }
}

TEST_P(MatmulTest, ThreadCountDoesNotChangeResult) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {1, 5, 130}) {
      const int64_t k = 300, m = 203;
      Weights w = make_weights(dtype, {m, k}, rng);
      Weights b = make_weights(DType::kF32, {m}, rng);
      std::vector<float> x(static_cast<size_t>(n * k));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (auto& v : x) v = normal(rng);
      std::vector<float> single(static_cast<size_t>(n * m), NAN);
      ThreadPool one(1);
      cpu_matmul_on(GetParam(), one, x.data(), n, k, w.tensor, &b.tensor, single.data(), m);
      for (int threads : {2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> multi(static_cast<size_t>(n * m), NAN);
        cpu_matmul_on(GetParam(), pool, x.data(), n, k, w.tensor, &b.tensor, multi.data(), m);
        for (int64_t i = 0; i < n * m; ++i)
          ASSERT_NEAR(multi[i], single[i], 1e-6 * std::max(1.0f, std::fabs(single[i])))
              << matmul_path_name(GetParam()) << " " << dtype_name(dtype) << " n=" << n << " threads=" << threads
              << " at " << i;
      }
    }
  }
}

// Continuous batching relies on this: a token row's output is the same bits whether it is
// multiplied alone (decode tiles) or among many (GEMM tiles), for k past one k-block too.
// (OpenBLAS's sgemm gives no such promise; it is the path only of CPUs without AVX2.)
TEST_P(MatmulTest, RowResultDoesNotDependOnRowCount) {
  if (GetParam() == MatmulPath::kBlas) GTEST_SKIP() << "OpenBLAS blocks by the row count; not batch-invariant";
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t k : {384, 2500}) {
      const int64_t m = 77, n = 9;
      Weights w = make_weights(dtype, {m, k}, rng);
      Weights b = make_weights(DType::kF32, {m}, rng);
      std::vector<float> x(static_cast<size_t>(n * k));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (auto& v : x) v = normal(rng);
      std::vector<float> together(static_cast<size_t>(n * m), NAN), alone(static_cast<size_t>(m), NAN);
      cpu_matmul_on(GetParam(), pool, x.data(), n, k, w.tensor, &b.tensor, together.data(), m);
      for (int64_t t = 0; t < n; ++t) {
        cpu_matmul_on(GetParam(), pool, x.data() + t * k, 1, k, w.tensor, &b.tensor, alone.data(), m);
        for (int64_t r = 0; r < m; ++r)
          ASSERT_EQ(alone[static_cast<size_t>(r)], together[static_cast<size_t>(t * m + r)])
              << matmul_path_name(GetParam()) << " " << dtype_name(dtype) << " k=" << k << " row " << t << " out " << r;
      }
    }
  }
}

// A grouped matmul (q/k/v, gate/up in one pass) equals one matmul per weight, bit for bit,
// whatever the thread count, including weights whose rows are not a multiple of the granule.
TEST_P(MatmulTest, GroupedEqualsSeparate) {
  if (!matmul_path_available(GetParam())) GTEST_SKIP() << "this CPU lacks " << matmul_path_name(GetParam());
  std::mt19937 rng(11);
  for (int64_t n : {1, 7}) {
    const int64_t k = 96;
    std::vector<Weights> ws;
    for (int64_t m : {37, 5, 70}) ws.push_back(make_weights(DType::kBF16, {m, k}, rng));
    Weights bias = make_weights(DType::kBF16, {5}, rng);
    std::vector<float> x(static_cast<size_t>(n * k));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(rng);
    const int64_t width = 37 + 5 + 70;
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> grouped(static_cast<size_t>(n * width), NAN), separate(grouped.size(), NAN);
      MatmulTarget targets[] = {{&ws[0].tensor, nullptr, grouped.data(), width},
                                {&ws[1].tensor, &bias.tensor, grouped.data() + 37, width},
                                {&ws[2].tensor, nullptr, grouped.data() + 42, width}};
      cpu_matmul_many_on(GetParam(), pool, x.data(), n, k, targets, 3);
      cpu_matmul_on(GetParam(), pool, x.data(), n, k, ws[0].tensor, nullptr, separate.data(), width);
      cpu_matmul_on(GetParam(), pool, x.data(), n, k, ws[1].tensor, &bias.tensor, separate.data() + 37, width);
      cpu_matmul_on(GetParam(), pool, x.data(), n, k, ws[2].tensor, nullptr, separate.data() + 42, width);
      for (size_t i = 0; i < grouped.size(); ++i)
        ASSERT_EQ(grouped[i], separate[i]) << matmul_path_name(GetParam()) << " n=" << n << " threads=" << threads << " at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Path, MatmulTest,
                         ::testing::Values(MatmulPath::kGeneric, MatmulPath::kAvx2, MatmulPath::kAvx512,
                                           MatmulPath::kBlas),
                         [](const auto& info) { return std::string(matmul_path_name(info.param)); });

TEST(MatmulDispatch, IsaCapLimitsChosenPath) {
  for (CpuIsa cap : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    set_cpu_isa_cap(cap);
    for (int64_t n : {1, 8, 128}) {
      MatmulPath path = choose_matmul_path(n, DType::kBF16);
      EXPECT_TRUE(matmul_path_available(path)) << matmul_path_name(path);
      if (cap != CpuIsa::kAvx512) {
        EXPECT_NE(path, MatmulPath::kAvx512) << "cap " << cpu_isa_name(cap);
      }
      if (cap == CpuIsa::kGeneric) {
        EXPECT_NE(path, MatmulPath::kAvx2);
      }
    }
  }
  set_cpu_isa_cap(CpuIsa::kAvx512);
}

// cpu_matmul (auto path) through the public entry point, with a bias.
TEST(MatmulDispatch, AutoPathMatchesReference) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (int64_t n : {1, 4, 40}) {
    Weights w = make_weights(DType::kBF16, {70, 130}, rng);
    Weights b = make_weights(DType::kF16, {70}, rng);
    std::vector<float> x(static_cast<size_t>(n * 130));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(rng);
    std::vector<float> out(static_cast<size_t>(n * 70), NAN);
    cpu_matmul(pool, x.data(), n, 130, w.tensor, &b.tensor, out.data(), 70);
    for (int64_t t = 0; t < n; ++t) {
      double err2 = 0, ref2 = 0;
      for (int64_t r = 0; r < 70; ++r) {
        double ref = b.exact[r];
        for (int64_t i = 0; i < 130; ++i) ref += static_cast<double>(x[t * 130 + i]) * w.exact[r * 130 + i];
        err2 += (out[t * 70 + r] - ref) * (out[t * 70 + r] - ref);
        ref2 += ref * ref;
      }
      ASSERT_LE(std::sqrt(err2), kTolerance * std::sqrt(ref2)) << "n=" << n << " row " << t;
    }
  }
}

TEST(MatmulDispatch, RejectsInconsistentShapes) {
  ThreadPool pool(1);
  std::vector<float> w(12), x(8), out(8);
  Tensor weight{w.data(), DType::kF32, {3, 4}};
  EXPECT_THROW(cpu_matmul(pool, x.data(), 2, 3, weight, nullptr, out.data(), 3), Error);  // ldx < k
  EXPECT_THROW(cpu_matmul(pool, x.data(), 2, 4, weight, nullptr, out.data(), 2), Error);  // ldo < m
  Tensor bias{w.data(), DType::kF32, {4}};
  EXPECT_THROW(cpu_matmul(pool, x.data(), 2, 4, weight, &bias, out.data(), 3), Error);
}

}  // namespace
}  // namespace kettle
