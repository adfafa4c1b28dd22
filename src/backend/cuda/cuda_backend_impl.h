// CudaBackend's declaration, shared by the files that implement it (one per
// responsibility): cuda_backend.cpp (construction and the plain ops),
// cuda_memory.cpp (device memory, copies, resident weights, workspaces),
// cuda_step_recording.cpp (run_step and its CUDA graphs), cuda_matmul_policy.cpp
// (which kernel each projection runs through), cuda_moe.cpp (mixture of experts).
// Internal to the backend: the rest of kettle sees cuda_backend.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/fixed_gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_timer.h"
#include "util/error.h"

namespace kettle {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorCategory::kInternal, "CUDA: {} failed: {}", what, cudaGetErrorString(status));
}

inline void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorCategory::kInternal, "cuBLAS: {} failed: {}", what, cublasGetStatusString(status));
}

inline const cuda::Bf16* bf16_data(const Tensor& w, const char* op) {
  if (w.dtype != DType::kBF16)
    fail(ErrorCategory::kInternal, "cuda {}: weight is {}, not a resident bf16 tensor", op, dtype_name(w.dtype));
  return static_cast<const cuda::Bf16*>(w.data);
}

inline const float* f32_data(const Tensor* w, const char* op) {
  if (w == nullptr || w->empty()) return nullptr;
  if (w->dtype != DType::kF32)
    fail(ErrorCategory::kInternal, "cuda {}: vector weight is {}, not a resident f32 tensor", op, dtype_name(w->dtype));
  return static_cast<const float*>(w->data);
}

// A grow-only device buffer for an op's temporaries.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

struct ExpertTable {
  void* pointers = nullptr;  // device [3, n_experts] of const Bf16*: gate, up, down
  int n_experts = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int ordinal, bool batch_invariant, Fp8Compute fp8);

  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }

  // ---- memory ----------------------------------------------------------------
  bool host_memory() const override { return false; }

  // Freed blocks are kept per size and handed out again first in, first out: a KV
  // cache freed and made again gets the same addresses in the same order, so its
  // recorded decode step matches again.
  void* allocate(size_t bytes) override;
  // Large buffers (a KV pool that grew) go back to the driver at once: their size does
  // not come again, and holding them would double the pool's footprint.
  void release(void* data, size_t bytes) override;
  DType kv_dtype() const override { return DType::kF16; }  // paging.cuh
  // f16 rows, or quantized rows of any codec (kv_rows.cuh): groups of 8 or more, so the
  // kernels' 8-element pieces never straddle one.
  bool runs_kv(const KvRowCodec& rows) const override {
    return rows.quantized() ? rows.group % 8 == 0 : rows.element == DType::kF16;
  }
  size_t free_memory() override;
  size_t total_memory() override;
  // Small copies (a step's token ids and positions, its logits or next id) go through
  // pinned memory, so they are true async DMAs rather than staged pageable copies.
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;

  Tensor resident(const Tensor& weight) override;
  // Affine weights: the codes in the decode kernel's tile layout, scales and biases as
  // they are (cuda_affine.cpp).
  Linear resident_linear(const Linear& linear) override;
  // A host tensor's bytes on the device as retile(raw, out) rearranges them (a kernel on the
  // stream from a temporary copy as stored), cached as resident() caches weights.
  Tensor resident_retiled(const Tensor& t, const std::function<void(const void*, void*)>& retile);
  bool runs(WeightScheme scheme) const override {
    return scheme == WeightScheme::kDense || scheme == WeightScheme::kAffine ||
           (scheme == WeightScheme::kFp8 && fp8_tensor_cores_);
  }
  bool can_run(const Linear& linear) const override;
  // The expert kernels read bf16 (quantized experts are widened at load).
  bool can_run_expert(const Linear& linear) const override { return linear.scheme == WeightScheme::kDense; }

  // The context holds while ops run (a recorded step's host-side choices are made then).
  void run_step(const StepContext& context, uint64_t key, const std::function<void()>& ops) override;

  double measure_copy_bandwidth() override;

  // ---- ops -------------------------------------------------------------------
  void project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* outs, int count,
               bool accumulate) override;
  void project_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                     const Projection& up, Activation act, float* out, int64_t ldo) override;

  void embed(const int32_t* ids, int64_t n, const Linear& table, float scale, float* out) override;

  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight, float eps, bool add_one,
                float* out, int64_t ldo) override;

  void add(float* x, const float* y, int64_t n) override;

  void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& l, const int32_t* positions,
                      const RopeParams& rope, float* q_out, const KvPages& kv) override;

  void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
                 const AttentionParams& params, float* out, int64_t ldo) override;

  void softcap(float* x, int64_t n, float cap) override;

  void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) override;

  void sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids) override;
  void mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks) override;

  // The argmax's per-row arrival counters, in a buffer of their own: zero when made, and each
  // call leaves its rows' counters zero, so a later call of more rows finds zeros too.
  unsigned* argmax_arrivals(int64_t rows);

  void moe(const float* x, int64_t n, int64_t hidden, const Linear& router, const std::vector<ExpertWeights>& experts,
           const MoeParams& params, float* out) override;

 private:
  static constexpr size_t kMaxGraphs = 128;  // decode steps: batch buckets × table-width buckets
  static constexpr size_t kReturnedBytes = size_t{256} << 20;
  static constexpr size_t kPinnedBytes = size_t{4} << 20;
  static constexpr size_t kCublasWorkspace = size_t{32} << 20;

  // A host tensor by address, type, size and a fingerprint of its bytes: memory freed
  // and reused for other weights at the same address must not find the old copy.
  struct ResidentKey {
    const void* data;
    DType dtype;
    int64_t numel;
    uint64_t fingerprint;
    bool operator<(const ResidentKey& o) const {
      if (data != o.data) return data < o.data;
      if (dtype != o.dtype) return dtype < o.dtype;
      if (numel != o.numel) return numel < o.numel;
      return fingerprint < o.fingerprint;
    }
  };

  // FNV-1a over up to 256 bytes at each end of the tensor.
  static uint64_t fingerprint(const Tensor& t);

  static size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

  static float element(const Tensor& t, size_t i);

  // A workspace at least `bytes` long. Growing it frees the old one, which recorded
  // steps may point at, so they are dropped (never while recording: the first, eager
  // run of every step sizes its workspaces).
  void* grow(Workspace& w, size_t bytes);

  void drop_graphs();

  // x normalised per row into a workspace (f32, dense).
  const float* normalized(const float* x, int64_t n, int64_t k, const InputNorm& norm);

  // Weights these kernels read (dense, or affine in the resident layout), without adapters.
  void check_linears(const Projection* outs, int count, const char* op) const;
  static const Tensor& weight_of(const Projection& p) { return p.linear->weight; }
  static int64_t in_of(const Projection& p) { return p.linear->in_features(); }
  static bool affine(const Projection& p) { return p.linear->scheme == WeightScheme::kAffine; }
  static bool dense(const Projection& p) { return p.linear->scheme == WeightScheme::kDense; }
  static const Tensor* bias_of(const Projection& p) { return p.linear->bias.empty() ? nullptr : &p.linear->bias; }

  // The projections: targets[i].out (+)= norm(x) · wᵢᵀ (+ bᵢ); the step's decode rows
  // (StepContext::decode_rows) first, then the prompt rows.
  void project_rows(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets, int count,
                    bool accumulate);

  void gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
             const Projection& up, Activation act, float* out, int64_t ldo);

  // Decode rows the fastest way: the GEMV for one row, cuBLAS's GEMM of its choice for more.
  void fast_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets, int count,
                    bool accumulate);

  void fast_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                  const Projection& up, Activation act, float* out, int64_t ldo);

  // Which GEMM: a fixed configuration per shape (FixedGemm: prompt rows, or decode rows
  // in a batch-invariant backend), or cuBLAS's choice for the row count (fast decode rows).
  enum class Gemm { kPromptFixed, kDecodeFixed, kHeuristic };

  // GEMMs on bf16 x (a norm writes its bf16 rows directly), or under the exact rule on x
  // as two bf16 halves (x = hi + lo, rows [0, n) and [n, 2n)), f32-accurate activations
  // for a GEMM that streams the weights once either way.
  void gemm_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets, int count,
                    bool accumulate, Gemm gemm);

  // out[n, m] (row stride ldo) (+)= xb[n, k] · wᵀ; cuBLAS sees the row-major product as
  // the column-major outᵀ[m, n] = W[k, m]ᵀ · xᵀ[k, n].
  void gemm_raw(const cuda::Bf16* xb, int64_t n, int64_t k, const Tensor& w, float* out, int64_t ldo, bool accumulate,
                Gemm gemm);

  void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld, Activation act,
                        float* out, int64_t ldo);

  // gemm_raw for any weight this backend runs: an affine one is dequantized to bf16 a
  // block of rows at a time (cuda_affine.cpp).
  void gemm_linear(const cuda::Bf16* xb, int64_t n, int64_t k, const Linear& w, float* out, int64_t ldo,
                   bool accumulate, Gemm gemm);

  // ---- affine decode rows (cuda_affine.cpp) ------------------------------------------------
  // Whether the targets run as one affine decode batch (all affine, one bits/group/type).
  static bool affine_batchable(const Projection* targets, int count);
  // Decode rows of affine weights take the MMA kernel: always when batch invariant (it is;
  // a GEMM on dequantized weights would sum otherwise), else while rows are few enough
  // that re-reading the codes per 8 columns beats dequantizing them.
  bool use_affine_decode(const Projection* targets, int count, int64_t rows) const;
  // Decode rows through the MMA kernel, at most 8 B columns (rows · split) per launch.
  void affine_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                      int count, bool accumulate);
  void affine_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                    const Projection& up, Activation act, float* out, int64_t ldo);
  void affine_rows(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, cuda::AffineBatch batch);
  cuda::AffineBatch affine_batch(const Linear& first) const;  // k, group, split of a batch led by `first`
  static cuda::AffineWeights affine_weights(const Linear& l);
  int affine_split() const { return context_.exact_activations ? 2 : 1; }

  // ---- FP8 weights (cuda_fp8.cpp) -------------------------------------------------------------
  bool can_run_fp8(const Linear& l) const;
  Linear resident_fp8(const Linear& l);
  // values uploaded as an f32 tensor of `shape`, cached under the host tensor they came from.
  Tensor resident_floats(const Tensor& source, const std::vector<float>& values, std::vector<int64_t> shape);
  static cuda::Fp8Weights fp8_weights(const Linear& l);
  // The FP8 GEMM for a scale layout and row kind (made on first use).
  cuda::FixedGemm& fp8_gemm(bool row_scales, Gemm gemm) const;
  // Whether cuBLASLt has FP8 GEMMs with both scale layouts here (asked once).
  bool fp8_gemms_offered() const;
  // Whether the projection runs as an FP8 GEMM (FP8 weights, and the step does not ask
  // for exact activations).
  bool fp8_product(const Projection& p) const;
  void fp8_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets, int count,
                   bool accumulate, Gemm gemm);
  // gemm_project's targets split: the FP8 products through fp8_project, the rest through it.
  void fp8_and_others(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                      int count, bool accumulate, Gemm gemm);

  // After each launch: a bad configuration shows up here, not three ops later.
  void check_launch(const char* what) {
    check(cudaGetLastError(), what);
    if (timer_.enabled()) timer_.mark(what);  // no string is built unless profiling
  }

  static void check_pages(const KvPages& kv, const char* op);
  // attention's split-K path (one table per query).
  void decode_attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                        int64_t max_kv, const AttentionParams& params, float* out, int64_t ldo);

  // Device table [gate pointers | up pointers | down pointers] for one layer's experts.
  const cuda::Bf16** expert_table(const std::vector<ExpertWeights>& experts);

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::FixedGemm> prompt_gemm_;  // prompt rows
  std::unique_ptr<cuda::FixedGemm> decode_gemm_;  // decode rows of a batch-invariant backend
  mutable std::unique_ptr<cuda::FixedGemm> fp8_gemms_[4];  // [block | row scales] × [prompt | decode rows]
  mutable std::optional<bool> fp8_offered_;                // fp8_gemms_offered, once asked
  cublasHandle_t cublas_ = nullptr;               // the fast decode GEMMs
  void* cublas_workspace_ = nullptr;
  std::string device_name_;
  std::map<size_t, std::deque<void*>> free_;
  std::map<ResidentKey, Tensor> resident_;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  std::unordered_map<const void*, ExpertTable> expert_tables_;
  bool capturing_ = false;
  int device_;              // the device ordinal
  bool batch_invariant_;    // decode rows through the fixed decode GEMM too
  bool fp8_tensor_cores_ = false;  // FP8 weights stay FP8 and run on the FP8 tensor cores
  StepContext context_;     // the running step's (run_step); outside one, all rows are prompt rows
  char* pinned_ = nullptr;  // staging for uploads, reused once the stream is idle
  size_t pinned_used_ = 0;
  char* pinned_out_ = nullptr;  // staging for downloads
  cuda::OpTimer timer_;
  Workspace affine_x_, affine_dense_, fp8_x_;
  Workspace gemm_x_, gemm_out_, normed_ws_, attention_ws_, attention_arrivals_, moe_ws_, argmax_ws_, argmax_arrivals_;
};

}  // namespace kettle
