// CpuBackend: the reference backend. Owns the thread pool and forwards each
// Backend op to its file in this folder.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "tensor/host_buffer.h"

namespace kettle {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}

  std::string name() const override { return "cpu"; }

  bool host_memory() const override { return true; }
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* data, size_t) override { std::free(data); }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  Tensor resident(const Tensor& weight) override { return weight; }  // the mmap'd view as it is
  void run_step(uint64_t, const std::function<void()>& ops) override { ops(); }

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
  void add_rms_norm(float* x, const float* y, int64_t rows, int64_t dim, const Tensor& weight, float eps,
                    bool add_one, float* out) override {
    cpu::add_rms_norm(pool_, x, y, rows, dim, weight, eps, add_one, out);
  }
  void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& layout, const int32_t* positions,
                      const RopeParams& rope, float* q_out, const KvPages& kv) override {
    cpu::qkv_rope_store(pool_, qkv, n, ld, layout, positions, rope, q_out, kv);
  }
  // The CPU composes the fused ops: norm (or product) into scratch, then the plain op. The
  // scratch only grows, so decoding allocates nothing per step.
  void norm_matmul_many(const float* x, int64_t n, const InputNorm& norm, const MatmulTarget* targets,
                        int count) override {
    const int64_t k = targets[0].w->dim(1);
    float* normed = scratch(n * k);
    cpu::rms_norm(pool_, x, n, k, k, *norm.weight, norm.eps, norm.add_one, normed, k);
    cpu_matmul_many(pool_, normed, n, k, targets, count);
  }
  void norm_matmul_gated(const float* x, int64_t n, const InputNorm& norm, const MatmulTarget& gate,
                         const MatmulTarget& up, Activation act, float* out, int64_t ldo) override {
    const int64_t k = gate.w->dim(1);
    float* normed = scratch(n * k);
    cpu::rms_norm(pool_, x, n, k, k, *norm.weight, norm.eps, norm.add_one, normed, k);
    matmul_gated(normed, n, k, gate, up, act, out, ldo);
  }
  void matmul_add(const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias, float* out,
                  int64_t ldo) override {
    const int64_t m = w.dim(0);
    float* product = scratch(n * m);
    cpu_matmul(pool_, x, n, ldx, w, bias, product, m);
    for (int64_t t = 0; t < n; ++t) cpu::add(pool_, out + t * ldo, product + t * m, m);
  }
  void matmul_gated(const float* x, int64_t n, int64_t ldx, const MatmulTarget& gate, const MatmulTarget& up,
                    Activation act, float* out, int64_t ldo) override {
    const MatmulTarget both[] = {gate, up};
    cpu_matmul_many(pool_, x, n, ldx, both, 2);
    cpu::gated_activation(pool_, gate.out, up.out, n, gate.w->dim(0), gate.ldo, act, out, ldo);
  }
  void rope(float* x, int64_t n_tokens, int64_t ld, int n_heads, int head_dim,
            const int32_t* positions, const RopeParams& rope) override {
    cpu::rope(pool_, x, n_tokens, ld, n_heads, head_dim, positions, rope);
  }
  void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld,
                        Activation act, float* out, int64_t ldo) override {
    cpu::gated_activation(pool_, gate, up, n, width, ld, act, out, ldo);
  }
  void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t,
                 const AttentionParams& params, float* out, int64_t ldo) override {
    cpu::attention(pool_, q, n, ldq, kv, positions, params, out, ldo);
  }
  void softcap(float* x, int64_t n, float cap) override { cpu::softcap(pool_, x, n, cap); }
  void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits + r * vocab;
      ids[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);  // first of equal maxima
    }
  }
  void sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids) override {
    std::vector<std::pair<float, int32_t>> candidates;
    for (int64_t r = 0; r < rows; ++r) ids[r] = cpu::sample_row(logits + r * vocab, vocab, params[r], candidates);
  }
  void moe(const float* x, int64_t n, int64_t hidden, const Tensor& router,
           const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) override {
    cpu::moe(pool_, x, n, hidden, router, experts, params, out);
  }

 private:
  float* scratch(int64_t count) {
    if (scratch_.size() < static_cast<size_t>(count)) scratch_.resize(static_cast<size_t>(count));
    return scratch_.data();
  }

  ThreadPool pool_;
  HostBuffer<float> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace kettle
