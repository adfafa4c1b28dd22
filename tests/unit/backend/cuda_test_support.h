// What the CUDA op tests share: random inputs, bf16 weights, the relative error,
// KV upload in the backend's element type, and the fixture holding a GPU and a
// CPU backend (the reference). Included by cuda_ops_test.cpp and
// cuda_matmul_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_array.h"

namespace kettle::cuda_test {

// The CUDA backend's plain KV rows (f16), for KvPages a test fills itself.
inline KvCodec f16_rows() {
  KvRowCodec rows;
  rows.element = DType::kF16;
  return {rows, rows};
}

inline std::vector<float> random_vec(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
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

inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;  // unwritten or broken
    d += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    n += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(d / n);
}

// Host keys or values in `backend`'s KV element type (Backend::kv_dtype: f32 or
// f16), in its memory; back to f32; and rounded through that type on the host.
inline BackendArray<unsigned char> kv_upload(Backend& backend, const std::vector<float>& host) {
  BackendArray<unsigned char> a(backend, host.size() * dtype_size(backend.kv_dtype()));
  if (dtype_size(backend.kv_dtype()) == sizeof(float)) {
    backend.to_device(a.data(), host.data(), a.bytes());
  } else {
    std::vector<uint16_t> bits(host.size());
    for (size_t i = 0; i < host.size(); ++i) bits[i] = f32_to_f16(host[i]);
    backend.to_device(a.data(), bits.data(), a.bytes());
  }
  return a;
}

inline std::vector<float> kv_download(Backend& backend, BackendArray<unsigned char>& a) {
  std::vector<float> host(a.bytes() / dtype_size(backend.kv_dtype()));
  if (dtype_size(backend.kv_dtype()) == sizeof(float)) {
    backend.to_host(host.data(), a.data(), a.bytes());
  } else {
    std::vector<uint16_t> bits(host.size());
    backend.to_host(bits.data(), a.data(), a.bytes());
    for (size_t i = 0; i < host.size(); ++i) host[i] = f16_to_f32(bits[i]);
  }
  return host;
}

inline std::vector<float> kv_rounded(const Backend& backend, std::vector<float> x) {
  if (dtype_size(backend.kv_dtype()) != sizeof(float))
    for (float& v : x) v = f16_to_f32(f32_to_f16(v));
  return x;
}

// One output of a projection as the tests write them: a weight, its bias, where it goes.
struct MatmulTarget {
  const Tensor* w;
  const Tensor* bias;  // or nullptr
  float* out;
  int64_t ldo;
};

class CudaOpsTest : public ::testing::Test {
 protected:
  // cuda_ops_test.cpp: quantized KV rows stored and read by both attention kernels.
  void expect_quantized_kv_rows(int head_dim, int kv_heads, int64_t n);
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device here (or kettle built without CUDA)";
    BackendOptions fast;
    fast.device = "cuda";
    fast.batch_invariant = false;
    gpu_fast_ = make_backend(fast);
    gpu_invariant_ = make_backend("cuda", 1);
    gpu_ = gpu_invariant_.get();
    cpu_ = make_cpu_backend(2);
  }

  // Which GPU backend the next buffers and ops use: batch-invariant decode rows or the
  // fastest ones (a construction-time choice; each buffer stays with its backend).
  void use_invariant(bool on) { gpu_ = on ? gpu_invariant_.get() : gpu_fast_.get(); }

  // Microseconds per run of op on the current GPU backend: one warm-up run, then reps
  // runs back to back, timed to a device-to-host copy that waits for them.
  double time_us(int reps, const std::function<void()>& op) {
    int32_t sink = 0;
    BackendArray<int32_t> one(*gpu_, 1);
    op();
    gpu_->to_host(&sink, one.data(), sizeof sink);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) op();
    gpu_->to_host(&sink, one.data(), sizeof sink);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  }

  // The projections through Backend::project / project_gated under the test's step
  // context (ctx_: decode rows, exact activations).
  void project(Backend& b, const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const MatmulTarget* t,
               int count, bool accumulate) {
    std::vector<Linear> linears;
    for (int i = 0; i < count; ++i) linears.push_back({*t[i].w, t[i].bias ? *t[i].bias : Tensor{}});
    std::vector<Projection> outs;
    for (int i = 0; i < count; ++i) outs.push_back({&linears[static_cast<size_t>(i)], t[i].out, t[i].ldo});
    b.run_step(ctx_, 0, [&] { b.project(x, n, ldx, norm, outs.data(), count, accumulate); });
  }
  void matmul(Backend& b, const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias, float* out,
              int64_t ldo) {
    const MatmulTarget t{&w, bias, out, ldo};
    project(b, x, n, ldx, nullptr, &t, 1, false);
  }
  void matmul_add(Backend& b, const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias, float* out,
                  int64_t ldo) {
    const MatmulTarget t{&w, bias, out, ldo};
    project(b, x, n, ldx, nullptr, &t, 1, true);
  }
  void matmul_many(Backend& b, const float* x, int64_t n, int64_t ldx, const MatmulTarget* t, int count) {
    project(b, x, n, ldx, nullptr, t, count, false);
  }
  void norm_matmul_many(Backend& b, const float* x, int64_t n, const InputNorm& norm, const MatmulTarget* t,
                        int count) {
    project(b, x, n, t[0].w->dim(1), &norm, t, count, false);
  }
  void gated(Backend& b, const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const MatmulTarget& gate,
             const MatmulTarget& up, Activation act, float* out, int64_t ldo) {
    const Linear g{*gate.w, gate.bias ? *gate.bias : Tensor{}}, u{*up.w, up.bias ? *up.bias : Tensor{}};
    b.run_step(ctx_, 0, [&] {
      b.project_gated(x, n, ldx, norm, {&g, gate.out, gate.ldo}, {&u, up.out, up.ldo}, act, out, ldo);
    });
  }
  void matmul_gated(Backend& b, const float* x, int64_t n, int64_t ldx, const MatmulTarget& gate,
                    const MatmulTarget& up, Activation act, float* out, int64_t ldo) {
    gated(b, x, n, ldx, nullptr, gate, up, act, out, ldo);
  }
  void norm_matmul_gated(Backend& b, const float* x, int64_t n, const InputNorm& norm, const MatmulTarget& gate,
                         const MatmulTarget& up, Activation act, float* out, int64_t ldo) {
    gated(b, x, n, gate.w->dim(1), &norm, gate, up, act, out, ldo);
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

  // Which matmul path the GPU's rows take: prompt rows, decode rows the fast way, or
  // decode rows through the batch-invariant plan.
  enum class Rows { kPrompt, kDecode, kInvariantDecode };
  static constexpr Rows kAllRows[] = {Rows::kPrompt, Rows::kDecode, Rows::kInvariantDecode};
  void as_rows(Rows rows, int64_t n) {
    use_invariant(rows == Rows::kInvariantDecode);
    ctx_.decode_rows = rows == Rows::kPrompt ? 0 : n;
  }
  static std::string name(Rows rows) {
    return rows == Rows::kPrompt ? "prompt rows" : rows == Rows::kDecode ? "decode rows" : "invariant decode rows";
  }

  std::mt19937_64 rng_{std::random_device{}()};
  std::unique_ptr<Backend> gpu_fast_, gpu_invariant_, cpu_;
  Backend* gpu_ = nullptr;  // one of the two
  StepContext ctx_;
};

// rows_from(first, count): the outputs (count rows of m) of rows [first, first + count) run
// as one batch. Each batch of `counts` rows from 0 must give the bits of its rows run alone.
inline void expect_same_bits_alone_and_batched(const std::function<std::vector<float>(int64_t, int64_t)>& rows_from,
                                               int64_t n, std::initializer_list<int64_t> counts,
                                               const std::string& label) {
  std::vector<float> alone;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> one = rows_from(t, 1);
    alone.insert(alone.end(), one.begin(), one.end());
  }
  for (int64_t count : counts) {
    const std::vector<float> batch = rows_from(0, count);
    EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float))) << label << ", batch of " << count;
  }
}

// Rows whose floats differ in any bit from `expected`'s (NaN included).
inline int64_t rows_differing(const std::vector<float>& got, const std::vector<std::vector<float>>& expected, int64_t width,
                       int64_t ld) {
  int64_t differing = 0;
  for (size_t t = 0; t < expected.size(); ++t)
    differing += std::memcmp(got.data() + static_cast<int64_t>(t) * ld, expected[t].data(),
                             static_cast<size_t>(width) * sizeof(float)) != 0;
  return differing;
}

}  // namespace kettle::cuda_test
