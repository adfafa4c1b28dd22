// CpuBackend: the reference backend. Owns the thread pool and forwards each
// Backend op to its file in this folder.
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"

namespace kettle {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}

  std::string name() const override { return "cpu"; }

  void matmul(const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias,
              float* out, int64_t ldo) override {
    cpu_matmul(pool_, x, n, ldx, w, bias, out, ldo);
  }
  void matmul_many(const float* x, int64_t n, int64_t ldx, const MatmulTarget* targets, int count) override {
    cpu_matmul_many(pool_, x, n, ldx, targets, count);
  }
  void embed(const int32_t* ids, int64_t n, const Tensor& table, float scale, float* out) override {
    cpu::embed(pool_, ids, n, table, scale, out);
  }
  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight,
                float eps, bool add_one, float* out, int64_t ldo) override {
    cpu::rms_norm(pool_, x, rows, dim, ld, weight, eps, add_one, out, ldo);
  }
  void add(float* x, const float* y, int64_t n) override { cpu::add(pool_, x, y, n); }
  void rope(float* x, int64_t n_tokens, int64_t ld, int n_heads, int head_dim,
            const int32_t* positions, const RopeParams& rope) override {
    cpu::rope(pool_, x, n_tokens, ld, n_heads, head_dim, positions, rope);
  }
  void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld,
                        Activation act, float* out, int64_t ldo) override {
    cpu::gated_activation(pool_, gate, up, n, width, ld, act, out, ldo);
  }
  void attention(const float* q, int64_t n, int64_t ldq, const float* k_cache, const float* v_cache,
                 int64_t ld_kv, int64_t start, const AttentionParams& params, float* out,
                 int64_t ldo) override {
    cpu::attention(pool_, q, n, ldq, k_cache, v_cache, ld_kv, start, params, out, ldo);
  }
  void softcap(float* x, int64_t n, float cap) override { cpu::softcap(pool_, x, n, cap); }
  void moe(const float* x, int64_t n, int64_t hidden, const Tensor& router,
           const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) override {
    cpu::moe(pool_, x, n, hidden, router, experts, params, out);
  }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace kettle
