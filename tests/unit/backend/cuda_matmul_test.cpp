// The CUDA matmul paths against the CPU op: prompt rows (the fixed cuBLASLt
// plan), decode rows (the GEMV, cuBLAS), invariant decode rows (the decode
// plan), and their batch invariance, bit for bit. Skipped where no CUDA device
// is present; ctest label: cuda.
#include "unit/backend/cuda_test_support.h"

namespace kettle::cuda_test {
namespace {

// Prompt rows (the fixed cuBLASLt plan), decode rows (the GEMV for one row, cuBLAS for
// more) and invariant decode rows (the decode plan) alike.
TEST_F(CudaOpsTest, MatmulDecodeAndPromptRowsWithBias) {
  for (int64_t n : {1, 2, 7, 20}) {
    for (int64_t k : {64, 200, 70}) {  // 70: not a multiple of 8 (GEMMs on 2-byte-aligned rows)
      for (Rows rows : kAllRows) {
        as_rows(rows, n);
        const int64_t m = 96, ldx = k + 3, ldo = m + 5;
        Bf16Weight w({m, k}, rng_);
        auto bias = random_vec(static_cast<size_t>(m), rng_);
        Tensor bias_t{bias.data(), DType::kF32, {m}};
        auto x = random_vec(static_cast<size_t>(n * ldx), rng_);
        std::vector<float> ref(static_cast<size_t>(n * ldo), 0.0f);
        matmul(*cpu_, x.data(), n, ldx, w.tensor, &bias_t, ref.data(), ldo);
        auto dx = up(x);
        auto dout = up(ref);  // the stride gaps keep the CPU's values; rows are poisoned below
        for (int64_t t = 0; t < n; ++t) {
          std::vector<float> nan(static_cast<size_t>(m), NAN);
          gpu_->to_device(dout.data() + t * ldo, nan.data(), nan.size() * sizeof(float));
        }
        Tensor gw = gpu_->resident(w.tensor), gb = gpu_->resident(bias_t);
        matmul(*gpu_, dx.data(), n, ldx, gw, &gb, dout.data(), ldo);
        EXPECT_LE(rel_err(down(dout), ref), 1e-2) << "n " << n << " k " << k << " " << name(rows);
      }
    }
  }
  as_rows(Rows::kPrompt, 0);
}

// Batch invariance (StepContext::decode_rows, BackendOptions::batch_invariant): a decode row's product
// and a prompt row's are the same bits alone, in a batch of any size, and beside rows of
// the other kind.
// Both activation rules; k = 4096, 512, 2056, and 70 (not a multiple of 8: rows only
// 2-byte aligned, a plan of its own); batches across the decode plan's row buckets
// (FixedGemm: 8, 32, 64, 256). Each row alone is also checked against the CPU.
TEST_F(CudaOpsTest, MatmulRowsAreTheSameBitsAloneAndInAnyBatch) {
  use_invariant(true);
  struct Shape {
    int64_t m, k;
  };
  for (bool exact : {false, true}) {
    ctx_.exact_activations = exact;
    for (Shape s : {Shape{300, 4096}, Shape{100, 512}, Shape{64, 2056}, Shape{40, 70}}) {
      const int64_t n = 260;
      Bf16Weight w({s.m, s.k}, rng_);
      Tensor gw = gpu_->resident(w.tensor);
      auto x = random_vec(static_cast<size_t>(n * s.k), rng_, 3.0f);
      std::vector<float> ref(static_cast<size_t>(n * s.m));
      matmul(*cpu_, x.data(), n, s.k, w.tensor, nullptr, ref.data(), s.m);
      auto dx = up(x);
      const auto run = [&](int64_t first, int64_t rows, int64_t decode_rows) {
        auto out = poisoned(static_cast<size_t>(rows * s.m));
        ctx_.decode_rows = (decode_rows);
        matmul(*gpu_, dx.data() + first * s.k, rows, s.k, gw, nullptr, out.data(), s.m);
        return down(out);
      };
      std::vector<std::vector<float>> decode_alone, prompt_alone;
      std::vector<float> decode_all, prompt_all;
      for (int64_t t = 0; t < n; ++t) {
        decode_alone.push_back(run(t, 1, 1));
        prompt_alone.push_back(run(t, 1, 0));
        decode_all.insert(decode_all.end(), decode_alone.back().begin(), decode_alone.back().end());
        prompt_all.insert(prompt_all.end(), prompt_alone.back().begin(), prompt_alone.back().end());
      }
      const std::string what =
          "m " + std::to_string(s.m) + " k " + std::to_string(s.k) + " exact " + std::to_string(exact);
      const double tol = exact ? 1e-4 : 1e-2;
      EXPECT_LE(rel_err(decode_all, ref), tol) << what;
      EXPECT_LE(rel_err(prompt_all, ref), tol) << what;
      for (int64_t rows : {2, 8, 9, 16, 17, 32, 33, 40, 64, 65, 70, 130, 256, 260}) {
        for (int64_t d : {rows, int64_t{0}, rows / 2}) {
          std::vector<std::vector<float>> expected;
          for (int64_t t = 0; t < rows; ++t) expected.push_back(t < d ? decode_alone[t] : prompt_alone[t]);
          EXPECT_EQ(rows_differing(run(0, rows, d), expected, s.m, s.m), 0)
              << what << ": rows " << rows << ", " << d << " of them decodes";
        }
      }
    }
  }
  ctx_.exact_activations = false;
  as_rows(Rows::kPrompt, 0);
}

// The same for the packed (q/k/v) and gated (gate/up) invariant decode launches.
TEST_F(CudaOpsTest, PackedAndGatedDecodeRowsAreTheSameBitsInAnyBatch) {
  use_invariant(true);
  const int64_t k = 2048, n = 40, inter = 200, width = 2 * inter, ldo = 48 + 16 + 16;
  Bf16Weight q({48, k}, rng_), kk({16, k}, rng_), v({16, k}, rng_), g({inter, k}, rng_), u({inter, k}, rng_);
  Tensor gq = gpu_->resident(q.tensor), gk = gpu_->resident(kk.tensor), gv = gpu_->resident(v.tensor);
  Tensor gg = gpu_->resident(g.tensor), gu = gpu_->resident(u.tensor);
  auto x = random_vec(static_cast<size_t>(n * k), rng_, 0.3f);
  auto dx = up(x);
  const auto packed = [&](int64_t first, int64_t rows) {
    auto out = poisoned(static_cast<size_t>(rows * ldo));
    const MatmulTarget targets[] = {
        {&gq, nullptr, out.data(), ldo}, {&gk, nullptr, out.data() + 48, ldo}, {&gv, nullptr, out.data() + 64, ldo}};
    ctx_.decode_rows = (rows);
    matmul_many(*gpu_, dx.data() + first * k, rows, k, targets, 3);
    return down(out);
  };
  const auto gated = [&](int64_t first, int64_t rows) {
    auto out = poisoned(static_cast<size_t>(rows * width));
    ctx_.decode_rows = (rows);
    matmul_gated(*gpu_, dx.data() + first * k, rows, k, {&gg, nullptr, out.data(), width},
                       {&gu, nullptr, out.data() + inter, width}, Activation::kSilu, out.data(), width);
    return down(out);
  };
  std::vector<std::vector<float>> packed_alone, gated_alone;
  for (int64_t t = 0; t < n; ++t) {
    packed_alone.push_back(packed(t, 1));
    gated_alone.push_back(gated(t, 1));
  }
  for (int64_t rows : {3, 16, 17, 40}) {
    const std::vector<std::vector<float>> p(packed_alone.begin(), packed_alone.begin() + rows);
    const std::vector<std::vector<float>> gt(gated_alone.begin(), gated_alone.begin() + rows);
    EXPECT_EQ(rows_differing(packed(0, rows), p, ldo, ldo), 0) << "packed, rows " << rows;
    EXPECT_EQ(rows_differing(gated(0, rows), gt, inter, width), 0) << "gated, rows " << rows;
  }
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaOpsTest, MatmulManyPacksTargets) {
  for (int64_t n : {1, 4, 30}) {
    for (Rows rows : kAllRows) {
      as_rows(rows, n);
      const int64_t k = 128, ldo = 48 + 16 + 16;
      Bf16Weight q({48, k}, rng_), kk({16, k}, rng_), v({16, k}, rng_);
      auto x = random_vec(static_cast<size_t>(n * k), rng_);
      std::vector<float> ref(static_cast<size_t>(n * ldo), NAN);
      const MatmulTarget cpu_targets[] = {{&q.tensor, nullptr, ref.data(), ldo},
                                          {&kk.tensor, nullptr, ref.data() + 48, ldo},
                                          {&v.tensor, nullptr, ref.data() + 64, ldo}};
      matmul_many(*cpu_, x.data(), n, k, cpu_targets, 3);
      auto dx = up(x);
      auto dout = poisoned(ref.size());
      Tensor gq = gpu_->resident(q.tensor), gk = gpu_->resident(kk.tensor), gv = gpu_->resident(v.tensor);
      const MatmulTarget gpu_targets[] = {{&gq, nullptr, dout.data(), ldo},
                                          {&gk, nullptr, dout.data() + 48, ldo},
                                          {&gv, nullptr, dout.data() + 64, ldo}};
      matmul_many(*gpu_, dx.data(), n, k, gpu_targets, 3);
      EXPECT_LE(rel_err(down(dout), ref), 1e-2) << "n " << n << " " << name(rows);
    }
  }
  as_rows(Rows::kPrompt, 0);
}

TEST_F(CudaOpsTest, MatmulGatedBothActivations) {
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    for (int64_t n : {1, 3, 25}) {
      for (Rows rows : kAllRows) {
        as_rows(rows, n);
        const int64_t k = 256, inter = 100, width = 2 * inter;
        Bf16Weight g({inter, k}, rng_), u({inter, k}, rng_);
        auto x = random_vec(static_cast<size_t>(n * k), rng_, 0.2f);
        std::vector<float> scratch(static_cast<size_t>(n * width), NAN);
        matmul_gated(*cpu_, x.data(), n, k, {&g.tensor, nullptr, scratch.data(), width},
                           {&u.tensor, nullptr, scratch.data() + inter, width}, act, scratch.data(), width);
        std::vector<float> ref;
        for (int64_t t = 0; t < n; ++t)
          ref.insert(ref.end(), scratch.begin() + t * width, scratch.begin() + t * width + inter);
        auto dx = up(x);
        auto dmlp = poisoned(static_cast<size_t>(n * width));
        Tensor gg = gpu_->resident(g.tensor), gu = gpu_->resident(u.tensor);
        matmul_gated(*gpu_, dx.data(), n, k, {&gg, nullptr, dmlp.data(), width},
                           {&gu, nullptr, dmlp.data() + inter, width}, act, dmlp.data(), width);
        auto all = down(dmlp);
        std::vector<float> out;
        for (int64_t t = 0; t < n; ++t) out.insert(out.end(), all.begin() + t * width, all.begin() + t * width + inter);
        EXPECT_LE(rel_err(out, ref), 1e-2) << "n " << n << " " << name(rows);
      }
    }
  }
  as_rows(Rows::kPrompt, 0);
}

// Both activation rules: x rounded to bf16 (the default), and exact (MoE models: x as
// bf16 hi + lo), on decode rows and prompt rows.
TEST_F(CudaOpsTest, NormFusedProjectionsAndResidualAdd) {
  for (bool exact : {false, true}) {
    ctx_.exact_activations = exact;
    for (int64_t n : {1, 3, 80}) {
      for (Rows rows : kAllRows) {
        as_rows(rows, n);
        for (bool add_one : {false, true}) {
          const int64_t k = 512, m = 96, inter = 64, width = 2 * inter;
          Bf16Weight w({m, k}, rng_), g({inter, k}, rng_), u({inter, k}, rng_), nw({k}, rng_), dn({k, inter}, rng_);
          auto x = random_vec(static_cast<size_t>(n * k), rng_, 3.0f);
          const InputNorm cpu_norm{&nw.tensor, 1e-5f, add_one};
          std::vector<float> ref(static_cast<size_t>(n * m), NAN), mlp(static_cast<size_t>(n * width), NAN);
          const MatmulTarget cpu_target{&w.tensor, nullptr, ref.data(), m};
          norm_matmul_many(*cpu_, x.data(), n, cpu_norm, &cpu_target, 1);
          norm_matmul_gated(*cpu_, x.data(), n, cpu_norm, {&g.tensor, nullptr, mlp.data(), width},
                                  {&u.tensor, nullptr, mlp.data() + inter, width}, Activation::kSilu, mlp.data(),
                                  width);
          auto residual = random_vec(static_cast<size_t>(n * k), rng_);
          auto cpu_residual = residual;
          matmul_add(*cpu_, mlp.data(), n, width, dn.tensor, nullptr, cpu_residual.data(), k);

          Tensor gw = gpu_->resident(w.tensor), gg = gpu_->resident(g.tensor), gu = gpu_->resident(u.tensor);
          Tensor gn = gpu_->resident(nw.tensor), gd = gpu_->resident(dn.tensor);
          const InputNorm gpu_norm{&gn, 1e-5f, add_one};
          auto dx = up(x);
          auto dout = poisoned(ref.size());
          auto dmlp = poisoned(mlp.size());
          const MatmulTarget gpu_target{&gw, nullptr, dout.data(), m};
          norm_matmul_many(*gpu_, dx.data(), n, gpu_norm, &gpu_target, 1);
          norm_matmul_gated(*gpu_, dx.data(), n, gpu_norm, {&gg, nullptr, dmlp.data(), width},
                                  {&gu, nullptr, dmlp.data() + inter, width}, Activation::kSilu, dmlp.data(), width);
          auto dres = up(residual);
          matmul_add(*gpu_, dmlp.data(), n, width, gd, nullptr, dres.data(), k);
          const double tol = exact ? 1e-4 : 1e-2;
          EXPECT_LE(rel_err(down(dout), ref), tol) << "n " << n << " add_one " << add_one << " exact " << exact;
          auto gpu_mlp = down(dmlp);
          std::vector<float> a, b;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < inter; ++i) {
              a.push_back(gpu_mlp[static_cast<size_t>(t * width + i)]);
              b.push_back(mlp[static_cast<size_t>(t * width + i)]);
            }
          EXPECT_LE(rel_err(a, b), tol) << "gated, n " << n;
          EXPECT_LE(rel_err(down(dres), cpu_residual), tol) << "residual add, n " << n;
        }
      }
    }
  }
  ctx_.exact_activations = false;
  as_rows(Rows::kPrompt, 0);
}

// Decode matmul speed at llama-3.1-8b's shapes (prints; asserts nothing): invariant decode
// rows (the fixed decode plan) against the fast path (the GEMV for one row, cuBLAS's
// choice for more), as GB/s of weights streamed; 20 back-to-back launches each.
TEST_F(CudaOpsTest, TimingDecodeMatmuls) {
  struct Shape {
    int64_t m, k;
  };
  for (Shape s : {Shape{4096, 4096}, Shape{14336, 4096}, Shape{4096, 14336}}) {
    std::vector<uint16_t> bits(static_cast<size_t>(s.m * s.k));
    uint32_t state = 12345;
    for (auto& b : bits) {  // small random values, cheaper to make than random_vec's normals
      state = state * 1664525u + 1013904223u;
      b = f32_to_bf16(static_cast<float>(static_cast<int>(state >> 24) - 128) / 512.0f);
    }
    Tensor w{bits.data(), DType::kBF16, {s.m, s.k}};
    Tensor gw = gpu_->resident(w);
    for (int64_t n : {1, 8, 32, 64, 256}) {
      auto dx = up(random_vec(static_cast<size_t>(n * s.k), rng_));
      auto dout = up(std::vector<float>(static_cast<size_t>(n * s.m), 0.0f));
      double us[2];
      for (bool invariant : {true, false}) {
        as_rows(invariant ? Rows::kInvariantDecode : Rows::kDecode, n);
        us[invariant] = time_us(20, [&] { matmul(*gpu_, dx.data(), n, s.k, gw, nullptr, dout.data(), s.m); });
      }
      const double gb = static_cast<double>(s.m * s.k * 2) / 1e3;
      std::printf("decode matmul %5lld x %5lld n %3lld: invariant %8.1f us (%6.0f GB/s), fast %8.1f us (%6.0f GB/s)\n",
                  static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(n), us[1],
                  gb / us[1], us[0], gb / us[0]);
    }
  }
  as_rows(Rows::kPrompt, 0);
}

}  // namespace
}  // namespace kettle::cuda_test
