// Affine (MLX-layout) 4- and 8-bit weights on CUDA against the CPU backend on
// the same host Linear (whose sums are those of the dense f32 dequantized
// weights, affine_test.cpp): decode rows through the MMA kernel (tight under
// the exact activation rule, where x goes in as bf16 hi + lo and the codes are
// exact), prompt rows and large fast batches through GEMMs on dequantized bf16
// rows, the gated form, the embedding, and decode rows the same bits alone and
// in any batch. Shapes the kernel does not take are refused by can_run (the
// runner dequantizes them). Skipped where no CUDA device is present.
#include "tensor/affine_quant.h"
#include "unit/backend/cuda_test_support.h"

namespace kettle::cuda_test {
namespace {

// A host affine weight [m, k]: random values quantized row by row, scales and biases
// stored in `dtype`.
struct AffineWeight {
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales16, biases16;
  std::vector<float> scales32, biases32, bias;
  Linear linear;
  AffineWeight(int64_t m, int64_t k, int bits, int group, DType dtype, std::mt19937_64& rng, bool with_bias) {
    const int64_t groups = k / group, words = k * bits / 32;
    codes.resize(static_cast<size_t>(m * words));
    scales32.resize(static_cast<size_t>(m * groups));
    biases32.resize(scales32.size());
    for (int64_t r = 0; r < m; ++r) {
      const std::vector<float> w = random_vec(static_cast<size_t>(k), rng, 0.5f);
      affine_quantize_row(w.data(), k, bits, group, codes.data() + r * words, scales32.data() + r * groups,
                          biases32.data() + r * groups, AffineFit::kLeastSquares, dtype);
    }
    linear.scheme = WeightScheme::kAffine;
    linear.weight = Tensor{codes.data(), DType::kU32, {m, words}};
    linear.affine.bits = bits;
    linear.affine.group_size = group;
    if (dtype == DType::kF32) {
      linear.affine.scales = Tensor{scales32.data(), DType::kF32, {m, groups}};
      linear.affine.biases = Tensor{biases32.data(), DType::kF32, {m, groups}};
    } else {
      for (size_t i = 0; i < scales32.size(); ++i) {
        scales16.push_back(dtype == DType::kBF16 ? f32_to_bf16(scales32[i]) : f32_to_f16(scales32[i]));
        biases16.push_back(dtype == DType::kBF16 ? f32_to_bf16(biases32[i]) : f32_to_f16(biases32[i]));
      }
      linear.affine.scales = Tensor{scales16.data(), dtype, {m, groups}};
      linear.affine.biases = Tensor{biases16.data(), dtype, {m, groups}};
    }
    if (with_bias) {
      bias = random_vec(static_cast<size_t>(m), rng);
      linear.bias = Tensor{bias.data(), DType::kF32, {m}};
    }
  }
};

class CudaAffineTest : public CudaOpsTest {
 protected:
  // out_i = x · linear_iᵀ for each target on backend b (device or host pointers to match).
  void run(Backend& b, const float* x, int64_t n, int64_t ldx, const std::vector<Linear>& linears,
           const std::vector<float*>& outs, int64_t ldo) {
    std::vector<Projection> p;
    for (size_t i = 0; i < linears.size(); ++i) p.push_back({&linears[i], outs[i], ldo});
    b.run_step(ctx_, 0, [&] { b.project(x, n, ldx, nullptr, p.data(), static_cast<int>(p.size()), false); });
  }
};

TEST_F(CudaAffineTest, ProjectionsMatchTheCpuEveryPathBitsGroupAndScaleType) {
  const int64_t k = 256, m0 = 48, m1 = 32, ldx = k + 8, ldo = m0 + m1 + 3;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        AffineWeight a(m0, k, bits, group, dtype, rng_, true), b(m1, k, bits, group, dtype, rng_, false);
        for (bool exact : {false, true})
          for (int64_t n : {1, 5, 8, 9, 20, 70})
            for (Rows rows : kAllRows) {
              ctx_.exact_activations = exact;
              auto x = random_vec(static_cast<size_t>(n * ldx), rng_, 2.0f);
              std::vector<float> ref(static_cast<size_t>(n * ldo), 0.0f);
              ctx_.decode_rows = 0;
              run(*cpu_, x.data(), n, ldx, {a.linear, b.linear}, {ref.data(), ref.data() + m0}, ldo);
              as_rows(rows, n);
              const std::vector<Linear> on_gpu = {gpu_->resident_linear(a.linear), gpu_->resident_linear(b.linear)};
              ASSERT_TRUE(gpu_->can_run(a.linear));
              auto dx = up(x);
              auto dout = up(ref);
              for (int64_t t = 0; t < n; ++t) {  // the outputs poisoned, the stride gaps kept
                std::vector<float> nan(static_cast<size_t>(m0 + m1), NAN);
                gpu_->to_device(dout.data() + t * ldo, nan.data(), nan.size() * sizeof(float));
              }
              run(*gpu_, dx.data(), n, ldx, on_gpu, {dout.data(), dout.data() + m0}, ldo);
              // The MMA kernel: decode rows (fast ones up to 64); exact codes, f32 sums.
              const bool kernel = rows != Rows::kPrompt && (rows == Rows::kInvariantDecode || n <= 64);
              const double tol = kernel && exact ? 3e-5 : 1e-2;
              EXPECT_LE(rel_err(down(dout), ref), tol) << bits << "-bit, groups of " << group << ", "
                                                       << dtype_name(dtype) << ", n " << n << ", " << name(rows)
                                                       << (exact ? ", exact" : "");
            }
      }
  ctx_.exact_activations = false;
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaAffineTest, DecodeRowsAreTheSameBitsAloneAndInAnyBatch) {
  const int64_t k = 1024, m = 96, n = 40;
  for (bool invariant : {true, false})
    for (bool exact : {false, true})
      for (int bits : {4, 8}) {
        use_invariant(invariant);
        ctx_.exact_activations = exact;
        AffineWeight w(m, k, bits, 64, DType::kBF16, rng_, true);
        const std::vector<Linear> on_gpu = {gpu_->resident_linear(w.linear)};
        auto dx = up(random_vec(static_cast<size_t>(n * k), rng_));
        const auto rows_from = [&](int64_t first, int64_t count) {
          auto out = poisoned(static_cast<size_t>(count * m));
          ctx_.decode_rows = count;
          run(*gpu_, dx.data() + first * k, count, k, on_gpu, {out.data()}, m);
          return down(out);
        };
        expect_same_bits_alone_and_batched(rows_from, n, {2, 7, 8, 9, 40},
                                           std::to_string(bits) + "-bit" + (invariant ? ", invariant" : ", fast") +
                                               (exact ? ", exact" : ""));
      }
  ctx_.exact_activations = false;
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaAffineTest, GatedProjectionMatchesTheCpu) {
  const int64_t k = 512, inter = 80, width = 2 * inter;
  for (int bits : {4, 8})
    for (int64_t n : {1, 9})
      for (Rows rows : kAllRows) {
        AffineWeight g(inter, k, bits, 64, DType::kBF16, rng_, false), u(inter, k, bits, 64, DType::kBF16, rng_, true);
        auto x = random_vec(static_cast<size_t>(n * k), rng_);
        const auto gated_on = [&](Backend& b, const Linear& gl, const Linear& ul, const float* xp, float* scratch,
                                  float* out) {
          b.run_step(ctx_, 0, [&] {
            b.project_gated(xp, n, k, nullptr, {&gl, scratch, width}, {&ul, scratch + inter, width}, Activation::kSilu,
                            out, inter);
          });
        };
        std::vector<float> scratch(static_cast<size_t>(n * width)), ref(static_cast<size_t>(n * inter));
        ctx_.decode_rows = 0;
        gated_on(*cpu_, g.linear, u.linear, x.data(), scratch.data(), ref.data());
        as_rows(rows, n);
        const Linear gg = gpu_->resident_linear(g.linear), gu = gpu_->resident_linear(u.linear);
        auto dx = up(x);
        auto dscratch = poisoned(scratch.size());
        auto dout = poisoned(ref.size());
        gated_on(*gpu_, gg, gu, dx.data(), dscratch.data(), dout.data());
        EXPECT_LE(rel_err(down(dout), ref), 1e-2) << bits << "-bit, n " << n << ", " << name(rows);
      }
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaAffineTest, EmbeddingRowsAreTheCpusValues) {
  const int64_t vocab = 64, dim = 128;
  for (int bits : {4, 8}) {
    AffineWeight table(vocab, dim, bits, 32, DType::kF16, rng_, false);
    const std::vector<int32_t> ids = {0, 63, 17, 17, 5};
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<float> ref(static_cast<size_t>(n * dim));
    cpu_->embed(ids.data(), n, table.linear, 0.5f, ref.data());
    const Linear on_gpu = gpu_->resident_linear(table.linear);
    auto dids = up(ids);
    auto dout = poisoned(ref.size());
    gpu_->embed(dids.data(), n, on_gpu, 0.5f, dout.data());
    EXPECT_LE(rel_err(down(dout), ref), 1e-6) << bits << "-bit";
  }
}

// The kernel's shapes: 4 and 8 bits, rows in blocks of 16, k in tiles of 64; the rest is
// the runner's to dequantize.
TEST_F(CudaAffineTest, OtherBitsAndShapesAreLeftToTheRunner) {
  EXPECT_TRUE(gpu_->can_run(AffineWeight(32, 128, 4, 64, DType::kBF16, rng_, false).linear));
  EXPECT_FALSE(gpu_->can_run(AffineWeight(32, 128, 3, 32, DType::kBF16, rng_, false).linear));
  EXPECT_FALSE(gpu_->can_run(AffineWeight(32, 128, 6, 32, DType::kBF16, rng_, false).linear));
  EXPECT_FALSE(gpu_->can_run(AffineWeight(24, 128, 4, 32, DType::kBF16, rng_, false).linear));
  EXPECT_FALSE(gpu_->can_run(AffineWeight(32, 160, 4, 32, DType::kBF16, rng_, false).linear));
}

}  // namespace
}  // namespace kettle::cuda_test
