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

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "util/log.h"

namespace kettle {

CudaBackend::CudaBackend(int ordinal, bool batch_invariant, Fp8Compute fp8)
    : device_(ordinal), batch_invariant_(batch_invariant) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  // Prompt rows: a plan for a prompt of a few hundred tokens, k unsplit (chosen for 2048
  // rows, a full chunk, it made 512-token prefill 11 % slower). Invariant decode rows: a
  // plan for 32 rows, split-K allowed (H200, 8b decode / B = 64 tok/s, plans for 8, 16,
  // 32, 64, 128 rows: 192.1 / 3,607, 191.5 / 6,536, 191.5 / 9,591, 178.1 / 9,571, 140.5 /
  // 8,748; 64-token contexts). Row buckets 8 / 64 / 256: where cuBLASLt's choice for
  // that many rows gives the 32-row plan's bits it serves them (8b B = 256 decode
  // 7,767 → 9,602 tok/s, the MLP's up projections' own 256-row plan matching; H200,
  // 2026-12-04).
  prompt_gemm_ = std::make_unique<cuda::FixedGemm>(stream_, 512, true);
  decode_gemm_ = std::make_unique<cuda::FixedGemm>(stream_, 32, false, std::vector<int64_t>{8, 32, 64, 256});
  check(cublasCreate(&cublas_), "cublasCreate");
  check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // A fixed cuBLAS workspace, so GEMMs may be recorded in a graph.
  check(cudaMalloc(&cublas_workspace_, kCublasWorkspace), "cudaMalloc (cuBLAS workspace)");
  check(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace), "cublasSetWorkspace");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  device_name_ = prop.name;
  // FP8 GEMMs with block or row scales: cuBLASLt on Hopper (sm_90; its block-scale modes).
  const bool hopper = prop.major == 9;
  if (fp8 == Fp8Compute::kFp8 && !hopper)
    fail(ErrorCategory::kInvalidArgument, "--fp8-compute fp8: {} (sm_{}{}) has no FP8 GEMMs kettle runs (Hopper, sm_90, "
         "does); auto or bf16 widen FP8 weights to bf16", device_name_, prop.major, prop.minor);
  // (and cuBLASLt's configurations for both scale layouts: fp8_gemms_offered, asked when an
  // FP8 weight first comes, or here when asked for).
  fp8_tensor_cores_ = hopper && fp8 == Fp8Compute::kFp8;
  if (fp8 == Fp8Compute::kFp8 && !fp8_gemms_offered())
    fail(ErrorCategory::kInvalidArgument, "--fp8-compute fp8: cuBLASLt offers no FP8 GEMM with block or row scales "
         "on {}; auto or bf16 widen FP8 weights to bf16", device_name_);
  check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), kPinnedBytes), "cudaMallocHost");
  check(cudaMallocHost(reinterpret_cast<void**>(&pinned_out_), kPinnedBytes), "cudaMallocHost");
  timer_.bind(stream_);
}

CudaBackend::~CudaBackend() {
  timer_.report();
  cudaStreamSynchronize(stream_);
  drop_graphs();
  for (auto& [bytes, list] : free_)
    for (void* p : list) cudaFree(p);
  for (auto& [key, copy] : resident_) cudaFree(const_cast<void*>(copy.data));
  for (auto& [key, table] : expert_tables_) cudaFree(table.pointers);
  for (auto& gemm : fp8_gemms_) gemm.reset();
  for (Workspace* w : {&affine_x_, &affine_dense_, &fp8_x_, &gemm_x_, &gemm_out_, &normed_ws_, &attention_ws_, &attention_arrivals_, &moe_ws_, &argmax_ws_,
                       &argmax_arrivals_})
    cudaFree(w->data);
  prompt_gemm_.reset();
  decode_gemm_.reset();
  cudaFree(cublas_workspace_);
  cublasDestroy(cublas_);
  cudaFreeHost(pinned_);
  cudaFreeHost(pinned_out_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::embed(const int32_t* ids, int64_t n, const Linear& table, float scale, float* out) {
  if (table.scheme == WeightScheme::kFp8 && can_run(table)) {
    cuda::fp8_embed(ids, n, fp8_weights(table), table.in_features(), scale, out, stream_);
    check_launch("fp8_embed");
    return;
  }
  if (table.scheme == WeightScheme::kAffine && can_run(table)) {
    cuda::affine_embed(ids, n, affine_weights(table), table.in_features(), scale, out, stream_);
    check_launch("affine_embed");
    return;
  }
  if (table.scheme != WeightScheme::kDense)
    fail(ErrorCategory::kUnsupported, "cuda embed: a {} table does not run here", scheme_name(table));
  cuda::embed(ids, n, bf16_data(table.weight, "embed"), table.weight.dim(1), scale, out, stream_);
  check_launch("embed");
}

void CudaBackend::rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight, float eps,
                           bool add_one, float* out, int64_t ldo) {
  cuda::rms_norm(x, rows, dim, ld, f32_data(&weight, "rms_norm"), eps, add_one, out, ldo, stream_);
  check_launch("rms_norm");
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
  cuda::add(x, y, n, stream_);
  check_launch("add");
}

void CudaBackend::qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& l, const int32_t* positions,
                                 const RopeParams& rope, float* q_out, const KvPages& kv) {
  check_pages(kv, "qkv_rope_store");
  cuda::qkv_rope_store(qkv, n, ld, l.n_heads, l.n_kv_heads, l.head_dim, f32_data(l.q_norm, "qkv_rope_store"),
                       f32_data(l.k_norm, "qkv_rope_store"), l.norm_eps, l.norm_add_one, positions, rope.inv_freq,
                       rope.rotary_dim, rope.attention_factor, q_out, kv, stream_);
  check_launch("qkv_rope_store");
}

void CudaBackend::attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                            int64_t max_kv, const AttentionParams& params, float* out, int64_t ldo) {
  if (params.head_dim > 256) fail(ErrorCategory::kUnsupported, "cuda attention: head_dim {} > 256", params.head_dim);
  check_pages(kv, "attention");
  // A prompt chunk (one shared table) goes to the tiled kernel whatever its length,
  // decodes (a table each) to the split-K one: a query's sums depend on its kind only.
  if (cuda::attention_prefill_supported(params, kv)) {
    cuda::attention_prefill(q, n, ldq, kv, positions, params, out, ldo, stream_);
    check_launch("attention_prefill");
  } else {
    decode_attention(q, n, ldq, kv, positions, max_kv, params, out, ldo);
  }
  if (const int block = kv.codec.value.rotation; block > 0) {  // values stored rotated: the output turns back once
    cuda::unrotate_heads(out, n, params.n_heads, params.head_dim, ldo, block, stream_);
    check_launch("unrotate_heads");
  }
}

void CudaBackend::decode_attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                                   int64_t max_kv, const AttentionParams& params, float* out, int64_t ldo) {
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

void CudaBackend::softcap(float* x, int64_t n, float cap) {
  cuda::softcap(x, n, cap, stream_);
  check_launch("softcap");
}

void CudaBackend::argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) {
  cuda::argmax_rows(logits, rows, vocab, ids, argmax_arrivals(rows), grow(argmax_ws_, cuda::argmax_partial_bytes(rows)),
                    stream_);
  check_launch("argmax");
}

void CudaBackend::sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids) {
  if (rows == 0) return;
  cuda::sample_rows(logits, rows, vocab, params, ids, argmax_arrivals(rows),
                    grow(argmax_ws_, cuda::argmax_partial_bytes(rows)), stream_);
  check_launch("sample");
}

void CudaBackend::mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks) {
  if (rows == 0) return;
  cuda::mask_logits(logits, rows, vocab, masks, stream_);
  check_launch("mask_logits");
}

// The argmax's per-row arrival counters, in a buffer of their own: zero when made, and each
// call leaves its rows' counters zero, so a later call of more rows finds zeros too.
unsigned* CudaBackend::argmax_arrivals(int64_t rows) {
  const size_t before = argmax_arrivals_.bytes;
  auto* arrivals = static_cast<unsigned*>(grow(argmax_arrivals_, static_cast<size_t>(rows) * sizeof(unsigned)));
  if (argmax_arrivals_.bytes != before)
    check(cudaMemsetAsync(arrivals, 0, argmax_arrivals_.bytes, stream_), "cudaMemsetAsync");
  return arrivals;
}

void CudaBackend::check_pages(const KvPages& kv, const char* op) {
  if (kv.block_size <= 0 || kv.tables == nullptr || kv.table_stride < 0)
    fail(ErrorCategory::kInternal,
         "cuda {}: KvPages needs block_size > 0 (got {}), a block table and table_stride >= 0", op, kv.block_size);
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int ordinal, bool batch_invariant, Fp8Compute fp8) {
  return std::make_unique<CudaBackend>(ordinal, batch_invariant, fp8);
}

}  // namespace kettle
