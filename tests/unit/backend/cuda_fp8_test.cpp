// FP8 e4m3 weights on CUDA (Hopper: the FP8 tensor-core GEMMs) against a
// double-precision reference of the product they define: x quantized per row
// and 128 columns (per row for row-scaled weights) to e4m3 with s = amax / 448,
// rounded to nearest even, times the weight's codes and scales. Every row kind
// (prompt, fast decode, invariant decode), block, row and tensor scales, biases;
// under the exact activation rule the weights' own values times f32 x; a row's
// bits the same alone and in any batch; the embedding gather; the shapes
// can_run takes. The backends run with --fp8-compute fp8; skipped where no CUDA
// device is present, and where it is not a Hopper GPU (no FP8 GEMMs).
#include <algorithm>

#include "support/e4m3.h"
#include "unit/backend/cuda_test_support.h"
#include "util/error.h"

namespace kettle::cuda_test {
namespace {

using test::e4m3_nearest;
using test::e4m3_value;

// A host FP8 weight [m, k]: random values, a scale per block of block_rows × block_cols
// (amax / 448), codes the nearest e4m3.
struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scales, bias;
  int64_t m, k, block_rows, block_cols, grid_cols;
  Linear linear;
  Fp8Weight(int64_t m_, int64_t k_, int64_t br, int64_t bc, std::mt19937_64& rng, bool with_bias)
      : m(m_), k(k_), block_rows(br), block_cols(bc), grid_cols((k_ + bc - 1) / bc) {
    const std::vector<float> w = random_vec(static_cast<size_t>(m * k), rng, 0.05f);
    const int64_t grid_rows = (m + br - 1) / br;
    scales.assign(static_cast<size_t>(grid_rows * grid_cols), 0.0f);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) {
        float& s = scales[static_cast<size_t>((r / br) * grid_cols + c / bc)];
        s = std::max(s, std::abs(w[static_cast<size_t>(r * k + c)]) / 448.0f);
      }
    codes.resize(w.size());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c)
        codes[static_cast<size_t>(r * k + c)] = e4m3_nearest(w[static_cast<size_t>(r * k + c)] / scale(r, c));
    linear.scheme = WeightScheme::kFp8;
    linear.weight = Tensor{codes.data(), DType::kF8E4M3, {m, k}};
    linear.fp8 = {Tensor{scales.data(), DType::kF32, {grid_rows, grid_cols}}, br, bc};
    if (with_bias) {
      bias = random_vec(static_cast<size_t>(m), rng);
      linear.bias = Tensor{bias.data(), DType::kF32, {m}};
    }
  }
  float scale(int64_t r, int64_t c) const { return scales[static_cast<size_t>((r / block_rows) * grid_cols + c / block_cols)]; }
  double value(int64_t r, int64_t c) const {
    return static_cast<double>(e4m3_value(codes[static_cast<size_t>(r * k + c)])) * scale(r, c);
  }
  bool row_scaled() const { return grid_cols == 1; }
};

// x's row as the FP8 GEMM takes it: per 128 columns (or the whole row) s = amax / 448 and
// the nearest e4m3 of x / s, back to its value.
std::vector<double> quantized_row(const float* x, int64_t k, bool whole_row) {
  std::vector<double> out(static_cast<size_t>(k));
  const int64_t span = whole_row ? k : 128;
  for (int64_t c0 = 0; c0 < k; c0 += span) {
    float amax = 0.0f;
    for (int64_t c = c0; c < c0 + span; ++c) amax = std::max(amax, std::abs(x[c]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t c = c0; c < c0 + span; ++c)
      out[static_cast<size_t>(c)] = static_cast<double>(e4m3_value(e4m3_nearest(x[c] / s))) * s;
  }
  return out;
}

// out[t, i] (stride ldo) = x_t · w_iᵀ + b_i in double: x as the FP8 GEMM quantizes it, or
// exact (the exact activation rule).
std::vector<float> reference(const std::vector<float>& x, int64_t n, int64_t ldx, const Fp8Weight& w, bool exact,
                             int64_t ldo) {
  std::vector<float> out(static_cast<size_t>(n * ldo), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> xq = quantized_row(x.data() + t * ldx, w.k, w.row_scaled());
    if (exact)
      for (int64_t c = 0; c < w.k; ++c) xq[static_cast<size_t>(c)] = x[static_cast<size_t>(t * ldx + c)];
    for (int64_t r = 0; r < w.m; ++r) {
      double s = w.bias.empty() ? 0.0 : w.bias[static_cast<size_t>(r)];
      for (int64_t c = 0; c < w.k; ++c) s += xq[static_cast<size_t>(c)] * w.value(r, c);
      out[static_cast<size_t>(t * ldo + r)] = static_cast<float>(s);
    }
  }
  return out;
}

class CudaFp8Test : public CudaOpsTest {
 protected:
  // Both GPU backends with --fp8-compute fp8 (a GPU without FP8 GEMMs refuses it).
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (IsSkipped()) return;
    try {
      for (bool invariant : {false, true}) {
        BackendOptions options;
        options.device = "cuda";
        options.batch_invariant = invariant;
        options.fp8 = Fp8Compute::kFp8;
        (invariant ? gpu_invariant_ : gpu_fast_) = make_backend(options);
      }
    } catch (const Error& e) {
      GTEST_SKIP() << "this GPU has no FP8 GEMMs kettle runs (Hopper has): " << e.what();
    }
    gpu_ = gpu_invariant_.get();
  }
  void run(const float* x, int64_t n, int64_t ldx, const std::vector<Linear>& linears, const std::vector<float*>& outs,
           int64_t ldo) {
    std::vector<Projection> p;
    for (size_t i = 0; i < linears.size(); ++i) p.push_back({&linears[i], outs[i], ldo});
    gpu_->run_step(ctx_, 0, [&] { gpu_->project(x, n, ldx, nullptr, p.data(), static_cast<int>(p.size()), false); });
  }
};

TEST_F(CudaFp8Test, ProjectionsMatchTheQuantizedProductOnEveryPath) {
  const int64_t k = 384, ldx = k + 8;
  struct Layout {
    const char* name;
    int64_t block_rows, block_cols;
  };
  for (const Layout layout : {Layout{"blocks of 128×128", 128, 128}, Layout{"a scale per row", 1, k},
                              Layout{"one scale", 1 << 20, 1 << 20}}) {
    const int64_t m0 = 256, m1 = 144, ldo = m0 + m1 + 3;  // 144: a block of rows cut short
    Fp8Weight a(m0, k, layout.block_rows, layout.block_cols, rng_, true),
        b(m1, k, layout.block_rows, layout.block_cols, rng_, false);
    for (bool exact : {false, true})
      for (int64_t n : {1, 5, 8, 9, 20, 70})
        for (Rows rows : kAllRows) {
          ctx_.exact_activations = exact;
          const auto x = random_vec(static_cast<size_t>(n * ldx), rng_, 2.0f);
          std::vector<float> ref = reference(x, n, ldx, a, exact, ldo), ref_b = reference(x, n, ldx, b, exact, ldo);
          for (int64_t t = 0; t < n; ++t)
            std::copy_n(ref_b.begin() + t * ldo, m1, ref.begin() + t * ldo + m0);
          as_rows(rows, n);
          ASSERT_TRUE(gpu_->can_run(a.linear)) << layout.name;
          const std::vector<Linear> on_gpu = {gpu_->resident_linear(a.linear), gpu_->resident_linear(b.linear)};
          auto dx = up(x);
          auto dout = up(ref);
          for (int64_t t = 0; t < n; ++t) {  // the outputs poisoned, the stride gaps kept
            std::vector<float> nan(static_cast<size_t>(m0 + m1), NAN);
            gpu_->to_device(dout.data() + t * ldo, nan.data(), nan.size() * sizeof(float));
          }
          run(dx.data(), n, ldx, on_gpu, {dout.data(), dout.data() + m0}, ldo);
          EXPECT_LE(rel_err(down(dout), ref), 1e-4)
              << layout.name << ", n " << n << ", " << name(rows) << (exact ? ", exact" : "");
        }
  }
  ctx_.exact_activations = false;
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaFp8Test, RowsAreTheSameBitsAloneAndInAnyBatch) {
  const int64_t k = 1024, m = 256, n = 40;
  for (Rows rows : kAllRows)
    for (int64_t block_cols : {int64_t{128}, k}) {
      as_rows(rows, n);
      Fp8Weight w(m, k, block_cols == k ? 1 : 128, block_cols, rng_, true);
      const std::vector<Linear> on_gpu = {gpu_->resident_linear(w.linear)};
      auto dx = up(random_vec(static_cast<size_t>(n * k), rng_));
      const auto rows_from = [&](int64_t first, int64_t count) {
        auto out = poisoned(static_cast<size_t>(count * m));
        as_rows(rows, count);
        run(dx.data() + first * k, count, k, on_gpu, {out.data()}, m);
        return down(out);
      };
      expect_same_bits_alone_and_batched(rows_from, n, {2, 7, 8, 9, 40},
                                         (block_cols == k ? "row scales, " : "block scales, ") + name(rows));
    }
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaFp8Test, EmbeddingRowsAreTheCodesTimesTheirScales) {
  const int64_t vocab = 300, dim = 256;
  Fp8Weight table(vocab, dim, 128, 128, rng_, false);
  const Linear on_gpu = gpu_->resident_linear(table.linear);
  const std::vector<int32_t> ids = {0, 299, 17, 128, 127, 5};
  auto dids = up(ids);
  auto dout = poisoned(ids.size() * static_cast<size_t>(dim));
  gpu_->embed(dids.data(), static_cast<int64_t>(ids.size()), on_gpu, 0.5f, dout.data());
  const std::vector<float> got = down(dout);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < dim; ++c)
      ASSERT_EQ(got[i * dim + c], static_cast<float>(table.value(ids[i], c)) * 0.5f) << "id " << ids[i] << ", " << c;
}

TEST_F(CudaFp8Test, OtherBlocksAndShapesAreLeftToTheRunner) {
  EXPECT_TRUE(gpu_->can_run(Fp8Weight(256, 384, 128, 128, rng_, false).linear));
  EXPECT_TRUE(gpu_->can_run(Fp8Weight(48, 80, 1, 80, rng_, false).linear));        // a scale per row
  EXPECT_FALSE(gpu_->can_run(Fp8Weight(256, 256, 64, 64, rng_, false).linear));    // other blocks
  EXPECT_FALSE(gpu_->can_run(Fp8Weight(256, 320, 128, 128, rng_, false).linear));  // k not whole blocks
  EXPECT_FALSE(gpu_->can_run(Fp8Weight(40, 128, 1, 128, rng_, false).linear));     // rows not in 16s
  for (Fp8Compute mode : {Fp8Compute::kBf16, Fp8Compute::kAuto}) {  // widened at load
    BackendOptions widen;
    widen.device = "cuda";
    widen.fp8 = mode;
    EXPECT_FALSE(make_backend(widen)->can_run(Fp8Weight(256, 384, 128, 128, rng_, false).linear));
  }
}

}  // namespace
}  // namespace kettle::cuda_test
