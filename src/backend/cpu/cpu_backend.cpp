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
#include "util/error.h"

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
  void run_step(const StepContext&, uint64_t, const std::function<void()>& ops) override { ops(); }

  void project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* outs, int count,
               bool accumulate) override {
    std::vector<MatmulTarget>& targets = targets_of(outs, count, "project");
    const int64_t k = outs[0].linear->in_features();
    if (norm != nullptr) x = normalized(x, n, k, *norm), ldx = k;
    if (!accumulate) return cpu_matmul_many(pool_, x, n, ldx, targets.data(), count);
    if (count != 1 || norm != nullptr)
      fail(ErrorCategory::kInternal, "cpu project: accumulate takes one output of un-normalised x");
    // The product into scratch, then added row by row into the residual stream.
    const int64_t m = outs[0].linear->out_features();
    float* product = scratch(n * m, 1);
    MatmulTarget into_scratch = targets[0];
    into_scratch.out = product;
    into_scratch.ldo = m;
    cpu_matmul_many(pool_, x, n, ldx, &into_scratch, 1);
    for (int64_t t = 0; t < n; ++t) cpu::add(pool_, outs[0].out + t * outs[0].ldo, product + t * m, m);
  }
  void project_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                     const Projection& up, Activation act, float* out, int64_t ldo) override {
    const Projection both[] = {gate, up};
    project(x, n, ldx, norm, both, 2, false);
    cpu::gated_activation(pool_, gate.out, up.out, n, gate.linear->out_features(), gate.ldo, act, out, ldo);
  }
  bool runs(WeightScheme scheme) const override {
    return scheme == WeightScheme::kDense || scheme == WeightScheme::kAffine;
  }
  // f32 rows, or any quantized codec (tensor/kv_codec.h): written and read by its own code.
  bool runs_kv(const KvRowCodec& rows) const override { return rows.quantized() || rows.element == DType::kF32; }

  void embed(const int32_t* ids, int64_t n, const Linear& table, float scale, float* out) override {
    cpu::embed(pool_, ids, n, table, scale, out);
  }
  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight,
                float eps, bool add_one, float* out, int64_t ldo) override {
    cpu::rms_norm(pool_, x, rows, dim, ld, weight, eps, add_one, out, ldo);
  }
  void add(float* x, const float* y, int64_t n) override { cpu::add(pool_, x, y, n); }
  void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& layout, const int32_t* positions,
                      const RopeParams& rope, float* q_out, const KvPages& kv) override {
    cpu::qkv_rope_store(pool_, qkv, n, ld, layout, positions, rope, q_out, kv);
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
  void mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks) override {
    const int64_t words = (vocab + 31) / 32;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < vocab; ++i)
        if (!((masks[r * words + i / 32] >> (i % 32)) & 1u)) logits[r * vocab + i] = -INFINITY;
  }
  void moe(const float* x, int64_t n, int64_t hidden, const Linear& router,
           const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) override {
    cpu::moe(pool_, x, n, hidden, router, experts, params, out);
  }

 private:
  // Grow-only scratch (decoding allocates nothing per step): slot 0 the normalised x,
  // slot 1 a product to add.
  float* scratch(int64_t count, int slot) {
    HostBuffer<float>& s = scratch_[slot];
    if (s.size() < static_cast<size_t>(count)) s.resize(static_cast<size_t>(count));
    return s.data();
  }
  const float* normalized(const float* x, int64_t n, int64_t k, const InputNorm& norm) {
    float* normed = scratch(n * k, 0);
    cpu::rms_norm(pool_, x, n, k, k, *norm.weight, norm.eps, norm.add_one, normed, k);
    return normed;
  }
  // The projections as the matmul kernels take them; dense and affine weights, no adapters.
  std::vector<MatmulTarget>& targets_of(const Projection* outs, int count, const char* op) {
    targets_.clear();
    for (int i = 0; i < count; ++i) {
      const Linear& l = *outs[i].linear;
      if (l.adapter != nullptr) fail(ErrorCategory::kUnsupported, "cpu {}: adapters do not run here yet", op);
      targets_.push_back(matmul_target(l, outs[i].out, outs[i].ldo));
    }
    return targets_;
  }

  ThreadPool pool_;
  HostBuffer<float> scratch_[2];
  std::vector<MatmulTarget> targets_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace kettle
