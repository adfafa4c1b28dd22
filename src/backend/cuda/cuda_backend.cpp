// CudaBackend: the Backend ops on one CUDA device, all on one stream.
// Weights are resident in bf16 (norm weights and biases in f32); activations
// are f32 and the KV cache f16 in device memory. Prompt rows' matmuls are
// cuBLASLt GEMMs of one fixed configuration per shape (fixed_gemm.h), which sum
// a row the same way whatever the row count. Decode rows' are the GEMV (one
// row, matmul.cu) and cuBLAS's own choice of GEMM (more), the fastest, or in a
// batch-invariant backend a second fixed cuBLASLt plan, chosen for decode batches.
// run_step records a step as a CUDA graph on its second sighting (the first
// runs eagerly, so workspaces are sized outside the capture) and replays it.
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/fixed_gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_timer.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(ErrorCategory::kInternal, "CUDA: {} failed: {}", what, cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorCategory::kInternal, "cuBLAS: {} failed: {}", what, cublasGetStatusString(status));
}

const cuda::Bf16* bf16_data(const Tensor& w, const char* op) {
  if (w.dtype != DType::kBF16)
    fail(ErrorCategory::kInternal, "cuda {}: weight is {}, not a resident bf16 tensor", op, dtype_name(w.dtype));
  return static_cast<const cuda::Bf16*>(w.data);
}

const float* f32_data(const Tensor* w, const char* op) {
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
  CudaBackend(int ordinal, bool batch_invariant) : device_(ordinal), batch_invariant_(batch_invariant) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Prompt rows: a plan for a prompt of a few hundred tokens, k unsplit (chosen for 2048
    // rows, a full chunk, it made 512-token prefill 11 % slower). Invariant decode rows: a
    // plan for 32 rows, split-K allowed (H200, 8b decode / B = 64 tok/s, plans for 8, 16,
    // 32, 64, 128 rows: 192.1 / 3,607, 191.5 / 6,536, 191.5 / 9,591, 178.1 / 9,571, 140.5 /
    // 8,748; 64-token contexts).
    prompt_gemm_ = std::make_unique<cuda::FixedGemm>(stream_, 512, true);
    decode_gemm_ = std::make_unique<cuda::FixedGemm>(stream_, 32, false);
    check(cublasCreate(&cublas_), "cublasCreate");
    check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // A fixed cuBLAS workspace, so GEMMs may be recorded in a graph.
    check(cudaMalloc(&cublas_workspace_, kCublasWorkspace), "cudaMalloc (cuBLAS workspace)");
    check(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace), "cublasSetWorkspace");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), kPinnedBytes), "cudaMallocHost");
    check(cudaMallocHost(reinterpret_cast<void**>(&pinned_out_), kPinnedBytes), "cudaMallocHost");
    timer_.bind(stream_);
  }

  ~CudaBackend() override {
    timer_.report();
    cudaStreamSynchronize(stream_);
    drop_graphs();
    for (auto& [bytes, list] : free_)
      for (void* p : list) cudaFree(p);
    for (auto& [key, copy] : resident_) cudaFree(const_cast<void*>(copy.data));
    for (auto& [key, table] : expert_tables_) cudaFree(table.pointers);
    for (Workspace* w : {&gemm_x_, &gemm_out_, &normed_ws_, &attention_ws_, &attention_arrivals_, &moe_ws_,
                         &argmax_ws_, &argmax_arrivals_})
      cudaFree(w->data);
    prompt_gemm_.reset();
    decode_gemm_.reset();
    cudaFree(cublas_workspace_);
    cublasDestroy(cublas_);
    cudaFreeHost(pinned_);
    cudaFreeHost(pinned_out_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }

  // ---- memory ----------------------------------------------------------------
  bool host_memory() const override { return false; }

  // Freed blocks are kept per size and handed out again first in, first out: a KV
  // cache freed and made again gets the same addresses in the same order, so its
  // recorded decode step matches again.
  void* allocate(size_t bytes) override {
    bytes = round_up(bytes);
    auto& list = free_[bytes];
    if (!list.empty()) {
      void* p = list.front();
      list.pop_front();
      return p;
    }
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  // Large buffers (a KV pool that grew) go back to the driver at once: their size does
  // not come again, and holding them would double the pool's footprint.
  void release(void* data, size_t bytes) override {
    if (data == nullptr) return;
    if (bytes >= kReturnedBytes) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      check(cudaFree(data), "cudaFree");
      return;
    }
    free_[round_up(bytes)].push_back(data);
  }
  DType kv_dtype() const override { return DType::kF16; }  // paging.cuh
  size_t free_memory() override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }
  // Small copies (a step's token ids and positions, its logits or next id) go through
  // pinned memory, so they are true async DMAs rather than staged pageable copies.
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes <= kPinnedBytes / 4) {
      if (pinned_used_ + bytes > kPinnedBytes) {
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // earlier copies have left
        pinned_used_ = 0;
      }
      char* slot = pinned_ + pinned_used_;
      std::memcpy(slot, src, bytes);
      pinned_used_ += round_up(bytes);
      check(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to device)");
      return;
    }
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to device)");
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes <= kPinnedBytes) {
      check(cudaMemcpyAsync(pinned_out_, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to host)");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      std::memcpy(dst, pinned_out_, bytes);
    } else {
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to host)");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
    pinned_used_ = 0;  // the stream is idle: every staged upload has landed
    timer_.restart();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (device)");
  }

  Tensor resident(const Tensor& weight) override {
    if (weight.empty()) return weight;
    const ResidentKey key{weight.data, weight.dtype, weight.numel(), fingerprint(weight)};
    auto it = resident_.find(key);
    if (it != resident_.end()) {
      Tensor view = it->second;
      view.shape = weight.shape;
      return view;
    }
    // Matrices in bf16 (the GEMV/GEMM operand); vectors (norms, biases) in f32.
    const bool matrix = weight.rank() >= 2;
    const DType dtype = matrix ? DType::kBF16 : DType::kF32;
    const size_t count = static_cast<size_t>(weight.numel());
    void* device = nullptr;
    check(cudaMalloc(&device, count * dtype_size(dtype)), "cudaMalloc (weights)");
    if (weight.dtype == dtype) {
      check(cudaMemcpy(device, weight.data, count * dtype_size(dtype), cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
    } else {
      std::vector<uint16_t> bits;
      std::vector<float> values(count);
      for (size_t i = 0; i < count; ++i) values[i] = element(weight, i);
      if (matrix) {
        bits.resize(count);
        for (size_t i = 0; i < count; ++i) bits[i] = f32_to_bf16(values[i]);
        check(cudaMemcpy(device, bits.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
      } else {
        check(cudaMemcpy(device, values.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
      }
    }
    Tensor copy{device, dtype, weight.shape};
    resident_.emplace(key, copy);
    return copy;
  }

  // The context holds while ops run (a recorded step's host-side choices are made then).
  void run_step(const StepContext& context, uint64_t key, const std::function<void()>& ops) override {
    check(cudaSetDevice(device_), "cudaSetDevice");  // this thread works on this backend's device
    struct Scoped {
      StepContext& held;
      StepContext saved;
      ~Scoped() { held = saved; }
    } scoped{context_, context_};
    context_ = context;
    if (key == 0 || timer_.enabled()) return ops();  // unrecorded, or each op timed on its own
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {  // first sighting: run it, sizing workspaces
      graphs_.emplace(key, nullptr);
      ops();
      return;
    }
    if (it->second == nullptr) {
      if (graphs_.size() > kMaxGraphs) {
        drop_graphs();
        graphs_.emplace(key, nullptr);
      }
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      capturing_ = true;
      try {
        ops();
      } catch (...) {
        capturing_ = false;
        cudaStreamEndCapture(stream_, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        throw;
      }
      capturing_ = false;
      check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(graph);
      graphs_[key] = exec;
      it = graphs_.find(key);
    }
    check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
  }

  double measure_copy_bandwidth() override {
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    check(cudaMalloc(&a, bytes), "cudaMalloc (copy test)");
    check(cudaMalloc(&b, bytes), "cudaMalloc (copy test)");
    check(cudaMemsetAsync(a, 1, bytes, stream_), "cudaMemset");
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < 3; ++i) copy(b, a, bytes);  // warm-up
    const int reps = 20;
    cudaEventRecord(start, stream_);
    for (int i = 0; i < reps; ++i) copy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    cudaEventRecord(stop, stream_);
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * static_cast<double>(bytes) * reps / (ms / 1e3);  // read + write
  }

  // ---- ops -------------------------------------------------------------------
  void project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* outs, int count,
               bool accumulate) override {
    check_linears(outs, count, "project");
    if (norm != nullptr && ldx != outs[0].linear->in_features())
      fail(ErrorCategory::kInternal, "cuda project: a normalised x is dense (ldx {} != k {})", ldx,
           outs[0].linear->in_features());
    project_rows(x, n, ldx, norm, outs, count, accumulate);
  }
  void project_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                     const Projection& up, Activation act, float* out, int64_t ldo) override {
    const Projection both[] = {gate, up};
    check_linears(both, 2, "project_gated");
    gated(x, n, ldx, norm, gate, up, act, out, ldo);
  }

  void embed(const int32_t* ids, int64_t n, const Tensor& table, float scale, float* out) override {
    cuda::embed(ids, n, bf16_data(table, "embed"), table.dim(1), scale, out, stream_);
    check_launch("embed");
  }

  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight, float eps, bool add_one,
                float* out, int64_t ldo) override {
    cuda::rms_norm(x, rows, dim, ld, f32_data(&weight, "rms_norm"), eps, add_one, out, ldo, stream_);
    check_launch("rms_norm");
  }

  void add(float* x, const float* y, int64_t n) override {
    cuda::add(x, y, n, stream_);
    check_launch("add");
  }

  void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& l, const int32_t* positions,
                      const RopeParams& rope, float* q_out, const KvPages& kv) override {
    check_pages(kv, "qkv_rope_store");
    cuda::qkv_rope_store(qkv, n, ld, l.n_heads, l.n_kv_heads, l.head_dim, f32_data(l.q_norm, "qkv_rope_store"),
                         f32_data(l.k_norm, "qkv_rope_store"), l.norm_eps, l.norm_add_one, positions, rope.inv_freq,
                         rope.rotary_dim, rope.attention_factor, q_out, kv, stream_);
    check_launch("qkv_rope_store");
  }

  void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
                 const AttentionParams& params, float* out, int64_t ldo) override {
    if (params.head_dim > 256) fail(ErrorCategory::kUnsupported, "cuda attention: head_dim {} > 256", params.head_dim);
    check_pages(kv, "attention");
    // A prompt chunk (one shared table) goes to the tiled kernel whatever its length,
    // decodes (a table each) to the split-K one: a query's sums depend on its kind only.
    if (cuda::attention_prefill_supported(params, kv)) {
      cuda::attention_prefill(q, n, ldq, kv, positions, params, out, ldo, stream_);
      check_launch("attention_prefill");
      return;
    }
    const size_t partial_bytes = static_cast<size_t>(cuda::attention_partial_floats(n, max_kv, params)) * sizeof(float);
    auto* partial = static_cast<float*>(grow(attention_ws_, partial_bytes));
    // Arrival counters live apart from the partials: zero when made, left zero by every call.
    const size_t before = attention_arrivals_.bytes;
    auto* arrivals =
        static_cast<unsigned*>(grow(attention_arrivals_, static_cast<size_t>(n * params.n_heads) * sizeof(unsigned)));
    if (attention_arrivals_.bytes != before)
      check(cudaMemsetAsync(arrivals, 0, attention_arrivals_.bytes, stream_), "cudaMemsetAsync");
    cuda::attention(q, n, ldq, kv, positions, max_kv, params, out, ldo, partial, arrivals, stream_);
    check_launch("attention");
  }

  void softcap(float* x, int64_t n, float cap) override {
    cuda::softcap(x, n, cap, stream_);
    check_launch("softcap");
  }

  void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) override {
    cuda::argmax_rows(logits, rows, vocab, ids, argmax_arrivals(rows),
                      grow(argmax_ws_, cuda::argmax_partial_bytes(rows)), stream_);
    check_launch("argmax");
  }

  void sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids) override {
    if (rows == 0) return;
    cuda::sample_rows(logits, rows, vocab, params, ids, argmax_arrivals(rows),
                      grow(argmax_ws_, cuda::argmax_partial_bytes(rows)), stream_);
    check_launch("sample");
  }

  // The argmax's per-row arrival counters, in a buffer of their own: zero when made, and each
  // call leaves its rows' counters zero, so a later call of more rows finds zeros too.
  unsigned* argmax_arrivals(int64_t rows) {
    const size_t before = argmax_arrivals_.bytes;
    auto* arrivals = static_cast<unsigned*>(grow(argmax_arrivals_, static_cast<size_t>(rows) * sizeof(unsigned)));
    if (argmax_arrivals_.bytes != before)
      check(cudaMemsetAsync(arrivals, 0, argmax_arrivals_.bytes, stream_), "cudaMemsetAsync");
    return arrivals;
  }

  void moe(const float* x, int64_t n, int64_t hidden, const Tensor& router, const std::vector<ExpertWeights>& experts,
           const MoeParams& params, float* out) override {
    const int n_experts = static_cast<int>(router.dim(0));
    const int64_t inter = experts.at(0).gate.dim(0);
    const int k = params.top_k;
    // workspace: router logits [n, E] | weights [n, k] | ids [n, k] | h [n, k, inter]
    const size_t logits_bytes = static_cast<size_t>(n * n_experts) * 4, pair_bytes = static_cast<size_t>(n * k) * 4;
    auto* base = static_cast<char*>(
        grow(moe_ws_, logits_bytes + 2 * pair_bytes + static_cast<size_t>(n * k * inter) * 4 + 1024));
    auto* logits = reinterpret_cast<float*>(base);
    auto* weights = reinterpret_cast<float*>(base + logits_bytes);
    auto* ids = reinterpret_cast<int32_t*>(base + logits_bytes + pair_bytes);
    auto* h = reinterpret_cast<float*>(base + logits_bytes + 2 * pair_bytes);
    cuda::router_logits(x, n, hidden, bf16_data(router, "moe"), n_experts, logits, stream_);
    check_launch("router_logits");
    cuda::route_top_k(logits, n, n_experts, k, params.renormalize, ids, weights, stream_);
    check_launch("route_top_k");
    const auto** table = expert_table(experts);
    cuda::moe_gate_up(x, n, hidden, ids, k, table, table + n_experts, inter, params.act, h, stream_);
    check_launch("moe_gate_up");
    cuda::moe_down(h, n, inter, ids, weights, k, table + 2 * n_experts, hidden, out, stream_);
    check_launch("moe_down");
  }

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
  static uint64_t fingerprint(const Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    const size_t bytes = t.nbytes(), edge = std::min<size_t>(bytes, 256);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < edge; ++i) h = (h ^ p[i]) * 1099511628211ull;
    for (size_t i = bytes - edge; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }

  static size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

  static float element(const Tensor& t, size_t i) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    switch (t.dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, p + i * 4, 4);
        return f;
      }
      case DType::kF16: {
        uint16_t b;
        std::memcpy(&b, p + i * 2, 2);
        return f16_to_f32(b);
      }
      case DType::kBF16: {
        uint16_t b;
        std::memcpy(&b, p + i * 2, 2);
        return bf16_to_f32(b);
      }
    }
    return 0.0f;
  }

  // A workspace at least `bytes` long. Growing it frees the old one, which recorded
  // steps may point at, so they are dropped (never while recording: the first, eager
  // run of every step sizes its workspaces).
  void* grow(Workspace& w, size_t bytes) {
    if (bytes <= w.bytes) return w.data;
    if (capturing_) fail(ErrorCategory::kInternal, "cuda: a workspace grew while recording a step");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    drop_graphs();
    cudaFree(w.data);
    w.bytes = round_up(std::max(bytes, w.bytes * 2));
    check(cudaMalloc(&w.data, w.bytes), "cudaMalloc (workspace)");
    return w.data;
  }

  void drop_graphs() {
    for (auto& [key, exec] : graphs_)
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  // x normalised per row into a workspace (f32, dense).
  const float* normalized(const float* x, int64_t n, int64_t k, const InputNorm& norm) {
    auto* out = static_cast<float*>(grow(normed_ws_, static_cast<size_t>(n * k) * sizeof(float)));
    cuda::rms_norm(x, n, k, k, f32_data(norm.weight, "norm"), norm.eps, norm.add_one, out, k, stream_);
    check_launch("rms_norm");
    return out;
  }

  // Dense weights without adapters are what these kernels read.
  static void check_linears(const Projection* outs, int count, const char* op) {
    for (int i = 0; i < count; ++i)
      if (outs[i].linear->scheme != WeightScheme::kDense || outs[i].linear->adapter != nullptr)
        fail(ErrorCategory::kUnsupported, "cuda {}: only dense weights without adapters run here", op);
  }
  static const Tensor& weight_of(const Projection& p) { return p.linear->weight; }
  static const Tensor* bias_of(const Projection& p) { return p.linear->bias.empty() ? nullptr : &p.linear->bias; }

  // The projections: targets[i].out (+)= norm(x) · wᵢᵀ (+ bᵢ); the step's decode rows
  // (StepContext::decode_rows) first, then the prompt rows.
  void project_rows(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets, int count,
                    bool accumulate) {
    const int64_t d = std::min(n, context_.decode_rows);
    if (d > 0 && !batch_invariant_)
      fast_project(x, d, ldx, norm, targets, count, accumulate);
    else if (d > 0)
      gemm_project(x, d, ldx, norm, targets, count, accumulate, Gemm::kDecodeFixed);
    if (d == n) return;
    if (d == 0) return gemm_project(x, n, ldx, norm, targets, count, accumulate, Gemm::kPromptFixed);
    std::vector<Projection> rest(targets, targets + count);
    for (Projection& t : rest) t.out += d * t.ldo;
    gemm_project(x + d * ldx, n - d, ldx, norm, rest.data(), count, accumulate, Gemm::kPromptFixed);
  }

  void gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
             const Projection& up, Activation act, float* out, int64_t ldo) {
    const int64_t inter = weight_of(gate).dim(0), d = std::min(n, context_.decode_rows);
    if (d > 0 && !batch_invariant_) {
      fast_gated(x, d, ldx, norm, gate, up, act, out, ldo);
    } else if (d > 0) {
      const Projection both[] = {gate, up};
      gemm_project(x, d, ldx, norm, both, 2, false, Gemm::kDecodeFixed);
      gated_activation(gate.out, up.out, d, inter, gate.ldo, act, out, ldo);
    }
    if (d == n) return;
    const Projection both[] = {{gate.linear, gate.out + d * gate.ldo, gate.ldo}, {up.linear, up.out + d * up.ldo, up.ldo}};
    gemm_project(x + d * ldx, n - d, ldx, norm, both, 2, false, Gemm::kPromptFixed);
    gated_activation(both[0].out, both[1].out, n - d, inter, gate.ldo, act, out + d * ldo, ldo);
  }

  // Decode rows the fastest way: the GEMV for one row, cuBLAS's GEMM of its choice for more.
  void fast_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                    int count, bool accumulate) {
    const int64_t k = weight_of(targets[0]).dim(1);
    if (n != 1 || !cuda::gemv_supported(k) || count > cuda::kMaxGemvTargets)
      return gemm_project(x, n, ldx, norm, targets, count, accumulate, Gemm::kHeuristic);
    // The norm runs as its own small kernel: normalising inside the GEMV (each warp
    // computing 1/rms first) measured slower (docs/performance.md, 2026-12-02).
    if (norm != nullptr) x = normalized(x, n, k, *norm);
    cuda::GemvTarget gemv[cuda::kMaxGemvTargets];
    for (int i = 0; i < count; ++i)
      gemv[i] = {bf16_data(weight_of(targets[i]), "matmul"), f32_data(bias_of(targets[i]), "matmul"), targets[i].out,
                 static_cast<int>(weight_of(targets[i]).dim(0))};
    cuda::gemv(gemv, count, x, static_cast<int>(k), accumulate, !context_.exact_activations, stream_);
    check_launch("gemv");
  }

  void fast_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                  const Projection& up, Activation act, float* out, int64_t ldo) {
    const int64_t k = weight_of(gate).dim(1);
    if (n != 1 || !cuda::gemv_supported(k)) {
      const Projection both[] = {gate, up};
      gemm_project(x, n, ldx, norm, both, 2, false, Gemm::kHeuristic);
      gated_activation(gate.out, up.out, n, weight_of(gate).dim(0), gate.ldo, act, out, ldo);
      return;
    }
    if (norm != nullptr) x = normalized(x, n, k, *norm);
    const cuda::GemvTarget g{bf16_data(weight_of(gate), "project_gated"), f32_data(bias_of(gate), "project_gated"),
                             nullptr, static_cast<int>(weight_of(gate).dim(0))};
    const cuda::GemvTarget u{bf16_data(weight_of(up), "project_gated"), f32_data(bias_of(up), "project_gated"),
                             nullptr, static_cast<int>(weight_of(up).dim(0))};
    cuda::gemv_gated(g, u, act, x, static_cast<int>(k), !context_.exact_activations, out, stream_);
    check_launch("gemv_gated");
  }

  // Which GEMM: a fixed configuration per shape (FixedGemm: prompt rows, or decode rows
  // in a batch-invariant backend), or cuBLAS's choice for the row count (fast decode rows).
  enum class Gemm { kPromptFixed, kDecodeFixed, kHeuristic };

  // GEMMs on bf16 x (a norm writes its bf16 rows directly), or under the exact rule on x
  // as two bf16 halves (x = hi + lo, rows [0, n) and [n, 2n)), f32-accurate activations
  // for a GEMM that streams the weights once either way.
  void gemm_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                    int count, bool accumulate, Gemm gemm) {
    const int64_t k = weight_of(targets[0]).dim(1);
    if (!context_.exact_activations) {
      auto* xb = static_cast<cuda::Bf16*>(grow(gemm_x_, static_cast<size_t>(n * k) * 2));
      if (norm != nullptr) {
        cuda::rms_norm_bf16(x, n, k, ldx, f32_data(norm->weight, "norm"), norm->eps, norm->add_one, xb, stream_);
        check_launch("rms_norm_bf16");
      } else {
        cuda::to_bf16(x, n, k, ldx, xb, stream_);
        check_launch("to_bf16");
      }
      for (int i = 0; i < count; ++i) {
        gemm_raw(xb, n, k, weight_of(targets[i]), targets[i].out, targets[i].ldo, accumulate, gemm);
        if (const float* b = f32_data(bias_of(targets[i]), "matmul")) {
          cuda::add_bias(targets[i].out, n, weight_of(targets[i]).dim(0), targets[i].ldo, b, stream_);
          check_launch("add_bias");
        }
      }
      return;
    }
    if (norm != nullptr) {
      x = normalized(x, n, k, *norm);
      ldx = k;
    }
    auto* xb = static_cast<cuda::Bf16*>(grow(gemm_x_, static_cast<size_t>(2 * n * k) * 2));
    cuda::to_bf16_split(x, n, k, ldx, xb, stream_);
    check_launch("to_bf16_split");
    for (int i = 0; i < count; ++i) {
      const int64_t m = weight_of(targets[i]).dim(0);
      auto* wide = static_cast<float*>(grow(gemm_out_, static_cast<size_t>(2 * n * m) * sizeof(float)));
      gemm_raw(xb, 2 * n, k, weight_of(targets[i]), wide, m, false, gemm);
      cuda::sum_halves(wide, n, m, f32_data(bias_of(targets[i]), "matmul"), targets[i].out, targets[i].ldo, accumulate,
                       stream_);
      check_launch("sum_halves");
    }
  }

  // out[n, m] (row stride ldo) (+)= xb[n, k] · wᵀ; cuBLAS sees the row-major product as
  // the column-major outᵀ[m, n] = W[k, m]ᵀ · xᵀ[k, n].
  void gemm_raw(const cuda::Bf16* xb, int64_t n, int64_t k, const Tensor& w, float* out, int64_t ldo, bool accumulate,
                Gemm gemm) {
    const int64_t m = w.dim(0);
    const float one = 1.0f, zero = 0.0f;
    if (gemm == Gemm::kPromptFixed)
      prompt_gemm_->run(xb, n, k, bf16_data(w, "matmul"), m, out, ldo, accumulate);
    else if (gemm == Gemm::kDecodeFixed)
      decode_gemm_->run(xb, n, k, bf16_data(w, "matmul"), m, out, ldo, accumulate);
    else
      check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                         static_cast<int>(k), &one, bf16_data(w, "matmul"), CUDA_R_16BF, static_cast<int>(k), xb,
                         CUDA_R_16BF, static_cast<int>(k), accumulate ? &one : &zero, out, CUDA_R_32F,
                         static_cast<int>(ldo), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    if (timer_.enabled()) timer_.mark("gemm " + std::to_string(n) + "x" + std::to_string(m) + "x" + std::to_string(k));
  }

  void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld, Activation act,
                        float* out, int64_t ldo) {
    cuda::gated_activation(gate, up, n, width, ld, act, out, ldo, stream_);
    check_launch("gated_activation");
  }

  // After each launch: a bad configuration shows up here, not three ops later.
  void check_launch(const char* what) {
    check(cudaGetLastError(), what);
    if (timer_.enabled()) timer_.mark(what);  // no string is built unless profiling
  }

  static void check_pages(const KvPages& kv, const char* op) {
    if (kv.block_size <= 0 || kv.tables == nullptr || kv.table_stride < 0)
      fail(ErrorCategory::kInternal,
           "cuda {}: KvPages needs block_size > 0 (got {}), a block table and table_stride >= 0", op, kv.block_size);
  }

  // Device table [gate pointers | up pointers | down pointers] for one layer's experts.
  const cuda::Bf16** expert_table(const std::vector<ExpertWeights>& experts) {
    const void* key = experts.front().gate.data;  // a layer's experts, by their resident address
    auto it = expert_tables_.find(key);
    if (it == expert_tables_.end()) {
      const size_t e = experts.size();
      std::vector<const cuda::Bf16*> host(3 * e);
      for (size_t i = 0; i < e; ++i) {
        host[i] = bf16_data(experts[i].gate, "moe");
        host[e + i] = bf16_data(experts[i].up, "moe");
        host[2 * e + i] = bf16_data(experts[i].down, "moe");
      }
      ExpertTable table{nullptr, static_cast<int>(e)};
      if (capturing_) fail(ErrorCategory::kInternal, "cuda: expert table built while recording a step");
      check(cudaMalloc(&table.pointers, host.size() * sizeof(void*)), "cudaMalloc (expert table)");
      check(cudaMemcpy(table.pointers, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice),
            "cudaMemcpy (expert table)");
      it = expert_tables_.emplace(key, table).first;
    }
    return static_cast<const cuda::Bf16**>(it->second.pointers);
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::FixedGemm> prompt_gemm_;  // prompt rows
  std::unique_ptr<cuda::FixedGemm> decode_gemm_;  // decode rows of a batch-invariant backend
  cublasHandle_t cublas_ = nullptr;  // the fast decode GEMMs
  void* cublas_workspace_ = nullptr;
  std::string device_name_;
  std::map<size_t, std::deque<void*>> free_;
  std::map<ResidentKey, Tensor> resident_;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  std::unordered_map<const void*, ExpertTable> expert_tables_;
  bool capturing_ = false;
  int device_;                      // the device ordinal
  bool batch_invariant_;            // decode rows through the fixed decode GEMM too
  StepContext context_;             // the running step's (run_step); outside one, all rows are prompt rows
  char* pinned_ = nullptr;          // staging for uploads, reused once the stream is idle
  size_t pinned_used_ = 0;
  char* pinned_out_ = nullptr;  // staging for downloads
  cuda::OpTimer timer_;
  Workspace gemm_x_, gemm_out_, normed_ws_, attention_ws_,
      attention_arrivals_, moe_ws_, argmax_ws_, argmax_arrivals_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int ordinal, bool batch_invariant) {
  return std::make_unique<CudaBackend>(ordinal, batch_invariant);
}

}  // namespace kettle
