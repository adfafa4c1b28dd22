// Every CUDA op against the CPU op (the reference backend) on fresh random
// inputs, device outputs poisoned (NaN) before each run. bf16 weights on
// both sides; tolerances are bf16 bounds where the GPU rounds activations to
// bf16 (the cuBLAS path), f32 bounds elsewhere. Skipped (not passed) where no
// CUDA device is present or kettle was built without CUDA; ctest label: cuda.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "backend/backend_array.h"

namespace kettle {
namespace {

std::vector<float> random_vec(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Bf16Weight {
  std::vector<uint16_t> bits;
  Tensor tensor;
  Bf16Weight(std::vector<int64_t> shape, std::mt19937_64& rng, float scale = 0.5f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    for (float f : random_vec(static_cast<size_t>(n), rng, scale)) bits.push_back(f32_to_bf16(f));
    tensor = Tensor{bits.data(), DType::kBF16, shape};
  }
};

double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;  // unwritten or broken
    d += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    n += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(d / n);
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
    gpu_ = make_backend("cuda", 1);
    cpu_ = make_cpu_backend(2);
  }

  // A device copy of host data.
  template <typename T>
  BackendArray<T> up(const std::vector<T>& host) {
    BackendArray<T> a(*gpu_, host.size());
    gpu_->to_device(a.data(), host.data(), a.bytes());
    return a;
  }
  BackendArray<float> poisoned(size_t n) { return up(std::vector<float>(n, NAN)); }
  std::vector<float> down(BackendArray<float>& a) {
    std::vector<float> host(a.size());
    gpu_->to_host(host.data(), a.data(), a.bytes());
    return host;
  }

  std::mt19937_64 rng_{std::random_device{}()};
  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaOpsTest, MatmulGemvAndGemmWithBias) {
  for (int64_t n : {1, 2, 7}) {
    for (int64_t k : {64, 200, 70}) {  // 70: not a multiple of 8 (the GEMV's scalar path / cuBLAS)
      const int64_t m = 96, ldx = k + 3, ldo = m + 5;
      Bf16Weight w({m, k}, rng_);
      auto bias = random_vec(static_cast<size_t>(m), rng_);
      Tensor bias_t{bias.data(), DType::kF32, {m}};
      auto x = random_vec(static_cast<size_t>(n * ldx), rng_);
      std::vector<float> ref(static_cast<size_t>(n * ldo), 0.0f);
      cpu_->matmul(x.data(), n, ldx, w.tensor, &bias_t, ref.data(), ldo);
      auto dx = up(x);
      auto dout = up(ref);  // the stride gaps keep the CPU's values; rows are poisoned below
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> nan(static_cast<size_t>(m), NAN);
        gpu_->to_device(dout.data() + t * ldo, nan.data(), nan.size() * sizeof(float));
      }
      Tensor gw = gpu_->resident(w.tensor), gb = gpu_->resident(bias_t);
      gpu_->matmul(dx.data(), n, ldx, gw, &gb, dout.data(), ldo);
      EXPECT_LE(rel_err(down(dout), ref), 1e-2) << "n " << n << " k " << k;
    }
  }
}

TEST_F(CudaOpsTest, MatmulManyPacksTargets) {
  for (int64_t n : {1, 4}) {
    const int64_t k = 128, ldo = 48 + 16 + 16;
    Bf16Weight q({48, k}, rng_), kk({16, k}, rng_), v({16, k}, rng_);
    auto x = random_vec(static_cast<size_t>(n * k), rng_);
    std::vector<float> ref(static_cast<size_t>(n * ldo), NAN);
    const MatmulTarget cpu_targets[] = {{&q.tensor, nullptr, ref.data(), ldo},
                                        {&kk.tensor, nullptr, ref.data() + 48, ldo},
                                        {&v.tensor, nullptr, ref.data() + 64, ldo}};
    cpu_->matmul_many(x.data(), n, k, cpu_targets, 3);
    auto dx = up(x);
    auto dout = poisoned(ref.size());
    Tensor gq = gpu_->resident(q.tensor), gk = gpu_->resident(kk.tensor), gv = gpu_->resident(v.tensor);
    const MatmulTarget gpu_targets[] = {{&gq, nullptr, dout.data(), ldo},
                                        {&gk, nullptr, dout.data() + 48, ldo},
                                        {&gv, nullptr, dout.data() + 64, ldo}};
    gpu_->matmul_many(dx.data(), n, k, gpu_targets, 3);
    EXPECT_LE(rel_err(down(dout), ref), 1e-2) << "n " << n;
  }
}

TEST_F(CudaOpsTest, MatmulGatedBothActivations) {
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    for (int64_t n : {1, 3}) {
      const int64_t k = 256, inter = 100, width = 2 * inter;
      Bf16Weight g({inter, k}, rng_), u({inter, k}, rng_);
      auto x = random_vec(static_cast<size_t>(n * k), rng_, 0.2f);
      std::vector<float> scratch(static_cast<size_t>(n * width), NAN);
      cpu_->matmul_gated(x.data(), n, k, {&g.tensor, nullptr, scratch.data(), width},
                         {&u.tensor, nullptr, scratch.data() + inter, width}, act, scratch.data(), width);
      std::vector<float> ref;
      for (int64_t t = 0; t < n; ++t)
        ref.insert(ref.end(), scratch.begin() + t * width, scratch.begin() + t * width + inter);
      auto dx = up(x);
      auto dmlp = poisoned(static_cast<size_t>(n * width));
      Tensor gg = gpu_->resident(g.tensor), gu = gpu_->resident(u.tensor);
      gpu_->matmul_gated(dx.data(), n, k, {&gg, nullptr, dmlp.data(), width}, {&gu, nullptr, dmlp.data() + inter, width},
                         act, dmlp.data(), width);
      auto all = down(dmlp);
      std::vector<float> out;
      for (int64_t t = 0; t < n; ++t) out.insert(out.end(), all.begin() + t * width, all.begin() + t * width + inter);
      EXPECT_LE(rel_err(out, ref), 1e-2) << "n " << n;
    }
  }
}

TEST_F(CudaOpsTest, NormFusedProjectionsAndResidualAdd) {
  for (int64_t n : {1, 3, 80}) {  // GEMV, hi+lo GEMM, plain bf16 GEMM
    for (bool add_one : {false, true}) {
      const int64_t k = 512, m = 96, inter = 64, width = 2 * inter;
      Bf16Weight w({m, k}, rng_), g({inter, k}, rng_), u({inter, k}, rng_), nw({k}, rng_), dn({k, inter}, rng_);
      auto x = random_vec(static_cast<size_t>(n * k), rng_, 3.0f);
      const InputNorm cpu_norm{&nw.tensor, 1e-5f, add_one};
      std::vector<float> ref(static_cast<size_t>(n * m), NAN), mlp(static_cast<size_t>(n * width), NAN);
      const MatmulTarget cpu_target{&w.tensor, nullptr, ref.data(), m};
      cpu_->norm_matmul_many(x.data(), n, cpu_norm, &cpu_target, 1);
      cpu_->norm_matmul_gated(x.data(), n, cpu_norm, {&g.tensor, nullptr, mlp.data(), width},
                              {&u.tensor, nullptr, mlp.data() + inter, width}, Activation::kSilu, mlp.data(), width);
      auto residual = random_vec(static_cast<size_t>(n * k), rng_);
      auto cpu_residual = residual;
      cpu_->matmul_add(mlp.data(), n, width, dn.tensor, nullptr, cpu_residual.data(), k);

      Tensor gw = gpu_->resident(w.tensor), gg = gpu_->resident(g.tensor), gu = gpu_->resident(u.tensor);
      Tensor gn = gpu_->resident(nw.tensor), gd = gpu_->resident(dn.tensor);
      const InputNorm gpu_norm{&gn, 1e-5f, add_one};
      auto dx = up(x);
      auto dout = poisoned(ref.size());
      auto dmlp = poisoned(mlp.size());
      const MatmulTarget gpu_target{&gw, nullptr, dout.data(), m};
      gpu_->norm_matmul_many(dx.data(), n, gpu_norm, &gpu_target, 1);
      gpu_->norm_matmul_gated(dx.data(), n, gpu_norm, {&gg, nullptr, dmlp.data(), width},
                              {&gu, nullptr, dmlp.data() + inter, width}, Activation::kSilu, dmlp.data(), width);
      auto dres = up(residual);
      gpu_->matmul_add(dmlp.data(), n, width, gd, nullptr, dres.data(), k);
      const double tol = n > 64 ? 1e-2 : 1e-4;  // bf16-rounded activations only above 64 rows
      EXPECT_LE(rel_err(down(dout), ref), tol) << "n " << n << " add_one " << add_one;
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

TEST_F(CudaOpsTest, RmsNormAndFusedResidual) {
  for (bool add_one : {false, true}) {
    const int64_t rows = 3, dim = 2048;
    auto x = random_vec(static_cast<size_t>(rows * dim), rng_);
    auto y = random_vec(static_cast<size_t>(rows * dim), rng_);
    Bf16Weight w({dim}, rng_);
    Tensor gw = gpu_->resident(w.tensor);
    std::vector<float> ref(x.size(), NAN);
    cpu_->rms_norm(x.data(), rows, dim, dim, w.tensor, 1e-6f, add_one, ref.data(), dim);
    auto dx = up(x);
    auto dout = poisoned(x.size());
    gpu_->rms_norm(dx.data(), rows, dim, dim, gw, 1e-6f, add_one, dout.data(), dim);
    EXPECT_LE(rel_err(down(dout), ref), 1e-5);

    auto cx = x;
    cpu_->add_rms_norm(cx.data(), y.data(), rows, dim, w.tensor, 1e-6f, add_one, ref.data());
    auto dy = up(y);
    dout = poisoned(x.size());
    gpu_->add_rms_norm(dx.data(), dy.data(), rows, dim, gw, 1e-6f, add_one, dout.data());
    EXPECT_LE(rel_err(down(dout), ref), 1e-5);
    EXPECT_LE(rel_err(down(dx), cx), 1e-6) << "the residual stream itself";
  }
}

TEST_F(CudaOpsTest, EmbedSoftcapAddActivation) {
  const int64_t vocab = 50, dim = 96;
  Bf16Weight table({vocab, dim}, rng_);
  std::vector<int32_t> ids = {3, 49, 0, 3};
  std::vector<float> ref(ids.size() * dim);
  cpu_->embed(ids.data(), 4, table.tensor, 1.7f, ref.data());
  auto dids = up(ids);
  auto dout = poisoned(ref.size());
  gpu_->embed(dids.data(), 4, gpu_->resident(table.tensor), 1.7f, dout.data());
  EXPECT_LE(rel_err(down(dout), ref), 1e-6);

  auto x = random_vec(1000, rng_, 5.0f), y = random_vec(1000, rng_);
  auto dx = up(x), dy = up(y);
  cpu_->softcap(x.data(), 1000, 3.0f);
  gpu_->softcap(dx.data(), 1000, 3.0f);
  EXPECT_LE(rel_err(down(dx), x), 1e-6);
  cpu_->add(x.data(), y.data(), 1000);
  gpu_->add(dx.data(), dy.data(), 1000);
  EXPECT_LE(rel_err(down(dx), x), 1e-6);

  for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kGelu}) {
    auto g = random_vec(4 * 80, rng_);
    std::vector<float> cref(4 * 37, NAN);
    cpu_->gated_activation(g.data(), g.data() + 40, 4, 37, 80, act, cref.data(), 37);
    auto dg = up(g);
    auto dres = poisoned(cref.size());
    gpu_->gated_activation(dg.data(), dg.data() + 40, 4, 37, 80, act, dres.data(), 37);
    EXPECT_LE(rel_err(down(dres), cref), 1e-5);
  }
}

TEST_F(CudaOpsTest, QkvRopeStoreWithNormsAndPartialRotation) {
  for (bool norms : {false, true}) {
    const int heads = 4, kv_heads = 2, hd = 64, rot = 32;
    const int64_t n = 3, ld = (heads + 2 * kv_heads) * hd + 8, qs = heads * hd, kvs = kv_heads * hd, rows = 40;
    auto qkv = random_vec(static_cast<size_t>(n * ld), rng_);
    std::vector<float> inv(rot / 2);
    for (int i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / rot);
    std::vector<int32_t> pos = {0, 17, 39};
    Bf16Weight qn({hd}, rng_), kn({hd}, rng_);
    QkvLayout cpu_layout{heads, kv_heads, hd, norms ? &qn.tensor : nullptr, norms ? &kn.tensor : nullptr, 1e-6f, false};
    std::vector<float> q(static_cast<size_t>(n * qs), NAN), kc(static_cast<size_t>(rows * kvs), 0.0f), vc = kc;
    cpu_->qkv_rope_store(qkv.data(), n, ld, cpu_layout, pos.data(), RopeParams{inv.data(), rot, 1.2f}, q.data(),
                         kc.data(), vc.data());
    Tensor gqn = gpu_->resident(qn.tensor), gkn = gpu_->resident(kn.tensor);
    QkvLayout gpu_layout = cpu_layout;
    gpu_layout.q_norm = norms ? &gqn : nullptr;
    gpu_layout.k_norm = norms ? &gkn : nullptr;
    auto dqkv = up(qkv);
    auto dinv = up(inv);
    auto dpos = up(pos);
    auto dq = poisoned(q.size());
    auto dk = up(std::vector<float>(kc.size(), 0.0f)), dv = up(std::vector<float>(vc.size(), 0.0f));
    gpu_->qkv_rope_store(dqkv.data(), n, ld, gpu_layout, dpos.data(), RopeParams{dinv.data(), rot, 1.2f}, dq.data(),
                         dk.data(), dv.data());
    EXPECT_LE(rel_err(down(dq), q), 1e-5);
    EXPECT_LE(rel_err(down(dk), kc), 1e-5);
    EXPECT_LE(rel_err(down(dv), vc), 1e-6);
  }
}

TEST_F(CudaOpsTest, AttentionDecodeAndPrefillGqaWindowSoftcap) {
  struct Case {
    int heads, kv_heads, hd;
    int64_t n, start, max_kv;
    int window;
    float softcap;
  };
  const Case cases[] = {{32, 8, 64, 1, 130, 256, 0, 0.0f},    {32, 8, 128, 1, 700, 1024, 0, 0.0f},
                        {6, 2, 16, 7, 9, 16, 5, 2.0f},        {16, 8, 128, 40, 300, 340, 0, 0.0f},
                        {8, 4, 256, 20, 0, 20, 8, 50.0f},     {12, 12, 64, 1, 5000, 8192, 4096, 0.0f}};
  for (const Case& c : cases) {
    AttentionParams p{c.heads, c.kv_heads, c.hd, 1.0f / std::sqrt(static_cast<float>(c.hd)), c.softcap, c.window};
    const int64_t qs = c.heads * c.hd, kvs = c.kv_heads * c.hd, total = c.start + c.n;
    auto q = random_vec(static_cast<size_t>(c.n * qs), rng_);
    auto k = random_vec(static_cast<size_t>(c.max_kv * kvs), rng_);
    auto v = random_vec(static_cast<size_t>(c.max_kv * kvs), rng_);
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < c.n; ++t) pos.push_back(static_cast<int32_t>(c.start + t));
    std::vector<float> ref(q.size(), NAN);
    cpu_->attention(q.data(), c.n, qs, k.data(), v.data(), kvs, pos.data(), total, p, ref.data(), qs);
    auto dq = up(q), dk = up(k), dv = up(v);
    auto dpos = up(pos);
    auto dout = poisoned(q.size());
    gpu_->attention(dq.data(), c.n, qs, dk.data(), dv.data(), kvs, dpos.data(), c.max_kv, p, dout.data(), qs);
    EXPECT_LE(rel_err(down(dout), ref), 1e-5) << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " n " << c.n;
  }
}

TEST_F(CudaOpsTest, MixtureOfExperts) {
  for (int64_t n : {1, 5}) {
    const int64_t hidden = 64, inter = 48;
    const int n_experts = 8;
    Bf16Weight router({n_experts, hidden}, rng_);
    std::vector<Bf16Weight> weights;
    for (int e = 0; e < 3 * n_experts; ++e)
      weights.emplace_back(e % 3 == 2 ? std::vector<int64_t>{hidden, inter} : std::vector<int64_t>{inter, hidden}, rng_);
    std::vector<ExpertWeights> cpu_experts, gpu_experts;
    for (int e = 0; e < n_experts; ++e) {
      const Tensor& g = weights[static_cast<size_t>(3 * e)].tensor;
      const Tensor& u = weights[static_cast<size_t>(3 * e + 1)].tensor;
      const Tensor& d = weights[static_cast<size_t>(3 * e + 2)].tensor;
      cpu_experts.push_back({g, u, d});
      gpu_experts.push_back({gpu_->resident(g), gpu_->resident(u), gpu_->resident(d)});
    }
    auto x = random_vec(static_cast<size_t>(n * hidden), rng_);
    for (bool renorm : {true, false}) {
      MoeParams params{2, renorm, Activation::kSilu};
      std::vector<float> ref(x.size(), NAN);
      cpu_->moe(x.data(), n, hidden, router.tensor, cpu_experts, params, ref.data());
      auto dx = up(x);
      auto dout = poisoned(x.size());
      gpu_->moe(dx.data(), n, hidden, gpu_->resident(router.tensor), gpu_experts, params, dout.data());
      EXPECT_LE(rel_err(down(dout), ref), 1e-2) << "n " << n << " renormalize " << renorm;
    }
  }
}

// A recorded step replays with new per-step values read from device memory.
TEST_F(CudaOpsTest, RecordedStepReadsPerStepValuesFromDeviceMemory) {
  const int64_t vocab = 16, dim = 64;
  Bf16Weight table({vocab, dim}, rng_);
  Tensor gt = gpu_->resident(table.tensor);
  BackendArray<int32_t> id(*gpu_, 1);
  auto out = poisoned(static_cast<size_t>(dim));
  for (int32_t token : {3, 3, 3, 7, 11}) {  // eager, record, replay, replay, replay
    gpu_->to_device(id.data(), &token, sizeof token);
    gpu_->run_step(42, [&] { gpu_->embed(id.data(), 1, gt, 1.0f, out.data()); });
    std::vector<float> ref(static_cast<size_t>(dim));
    cpu_->embed(&token, 1, table.tensor, 1.0f, ref.data());
    EXPECT_EQ(down(out), ref) << "token " << token;
  }
}

}  // namespace
}  // namespace kettle
