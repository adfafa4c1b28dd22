// Which kernels a projection runs through: prompt rows through the fixed
// cuBLASLt plan, decode rows through the GEMV (one row) or cuBLAS's choice
// (more), or the fixed decode plan in a batch-invariant backend; x rounded to
// bf16, or split into bf16 halves when the step keeps activations exact.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {

void CudaBackend::project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* outs,
                          int count, bool accumulate) {
  check_linears(outs, count, "project");
  if (norm != nullptr && ldx != outs[0].linear->in_features())
    fail(ErrorCategory::kInternal, "cuda project: a normalised x is dense (ldx {} != k {})", ldx,
         outs[0].linear->in_features());
  project_rows(x, n, ldx, norm, outs, count, accumulate);
}

void CudaBackend::project_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                                const Projection& up, Activation act, float* out, int64_t ldo) {
  const Projection both[] = {gate, up};
  check_linears(both, 2, "project_gated");
  gated(x, n, ldx, norm, gate, up, act, out, ldo);
}

// x normalised per row into a workspace (f32, dense).
const float* CudaBackend::normalized(const float* x, int64_t n, int64_t k, const InputNorm& norm) {
  auto* out = static_cast<float*>(grow(normed_ws_, static_cast<size_t>(n * k) * sizeof(float)));
  cuda::rms_norm(x, n, k, k, f32_data(norm.weight, "norm"), norm.eps, norm.add_one, out, k, stream_);
  check_launch("rms_norm");
  return out;
}

// Weights these kernels read (dense, or affine in the resident layout), without adapters.
void CudaBackend::check_linears(const Projection* outs, int count, const char* op) const {
  for (int i = 0; i < count; ++i)
    if (!can_run(*outs[i].linear) || outs[i].linear->adapter != nullptr)
      fail(ErrorCategory::kUnsupported, "cuda {}: {} weights{} do not run here", op, scheme_name(*outs[i].linear),
           outs[i].linear->adapter != nullptr ? " with an adapter" : "");
}

// The projections: targets[i].out (+)= norm(x) · wᵢᵀ (+ bᵢ); the step's decode rows
// (StepContext::decode_rows) first, then the prompt rows.
void CudaBackend::project_rows(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                               int count, bool accumulate) {
  const int64_t d = std::min(n, context_.decode_rows);
  if (d > 0 && affine(targets[0]) && use_affine_decode(targets, count, d))
    affine_project(x, d, ldx, norm, targets, count, accumulate);
  else if (d > 0 && !batch_invariant_)
    fast_project(x, d, ldx, norm, targets, count, accumulate);
  else if (d > 0)
    gemm_project(x, d, ldx, norm, targets, count, accumulate, Gemm::kDecodeFixed);
  if (d == n) return;
  if (d == 0) return gemm_project(x, n, ldx, norm, targets, count, accumulate, Gemm::kPromptFixed);
  std::vector<Projection> rest(targets, targets + count);
  for (Projection& t : rest) t.out += d * t.ldo;
  gemm_project(x + d * ldx, n - d, ldx, norm, rest.data(), count, accumulate, Gemm::kPromptFixed);
}

void CudaBackend::gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                        const Projection& up, Activation act, float* out, int64_t ldo) {
  const int64_t inter = weight_of(gate).dim(0), d = std::min(n, context_.decode_rows);
  const Projection pair[] = {gate, up};
  if (d > 0 && affine(gate) && use_affine_decode(pair, 2, d)) {
    affine_gated(x, d, ldx, norm, gate, up, act, out, ldo);
  } else if (d > 0 && !batch_invariant_) {
    fast_gated(x, d, ldx, norm, gate, up, act, out, ldo);
  } else if (d > 0) {
    const Projection both[] = {gate, up};
    gemm_project(x, d, ldx, norm, both, 2, false, Gemm::kDecodeFixed);
    gated_activation(gate.out, up.out, d, inter, gate.ldo, act, out, ldo);
  }
  if (d == n) return;
  const Projection both[] = {{gate.linear, gate.out + d * gate.ldo, gate.ldo},
                             {up.linear, up.out + d * up.ldo, up.ldo}};
  gemm_project(x + d * ldx, n - d, ldx, norm, both, 2, false, Gemm::kPromptFixed);
  gated_activation(both[0].out, both[1].out, n - d, inter, gate.ldo, act, out + d * ldo, ldo);
}

// Decode rows the fastest way: the GEMV for one row, cuBLAS's GEMM of its choice for more.
void CudaBackend::fast_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                               int count, bool accumulate) {
  const int64_t k = in_of(targets[0]);
  bool all_dense = true;
  for (int i = 0; i < count; ++i) all_dense = all_dense && dense(targets[i]);
  if (n != 1 || !all_dense || !cuda::gemv_supported(k) || count > cuda::kMaxGemvTargets)
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

void CudaBackend::fast_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                             const Projection& up, Activation act, float* out, int64_t ldo) {
  const int64_t k = in_of(gate);
  if (n != 1 || !dense(gate) || !dense(up) || !cuda::gemv_supported(k)) {
    const Projection both[] = {gate, up};
    gemm_project(x, n, ldx, norm, both, 2, false, Gemm::kHeuristic);
    gated_activation(gate.out, up.out, n, weight_of(gate).dim(0), gate.ldo, act, out, ldo);
    return;
  }
  if (norm != nullptr) x = normalized(x, n, k, *norm);
  const cuda::GemvTarget g{bf16_data(weight_of(gate), "project_gated"), f32_data(bias_of(gate), "project_gated"),
                           nullptr, static_cast<int>(weight_of(gate).dim(0))};
  const cuda::GemvTarget u{bf16_data(weight_of(up), "project_gated"), f32_data(bias_of(up), "project_gated"), nullptr,
                           static_cast<int>(weight_of(up).dim(0))};
  cuda::gemv_gated(g, u, act, x, static_cast<int>(k), !context_.exact_activations, out, stream_);
  check_launch("gemv_gated");
}

// GEMMs on bf16 x (a norm writes its bf16 rows directly), or under the exact rule on x
// as two bf16 halves (x = hi + lo, rows [0, n) and [n, 2n)), f32-accurate activations
// for a GEMM that streams the weights once either way. FP8 weights take the FP8 GEMMs
// (fp8_project) unless the step asks for exact activations.
void CudaBackend::gemm_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                               int count, bool accumulate, Gemm gemm) {
  if (std::any_of(targets, targets + count, [&](const Projection& p) { return fp8_product(p); }))
    return fp8_and_others(x, n, ldx, norm, targets, count, accumulate, gemm);
  const int64_t k = in_of(targets[0]);
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
      gemm_linear(xb, n, k, *targets[i].linear, targets[i].out, targets[i].ldo, accumulate, gemm);
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
    gemm_linear(xb, 2 * n, k, *targets[i].linear, wide, m, false, gemm);
    cuda::sum_halves(wide, n, m, f32_data(bias_of(targets[i]), "matmul"), targets[i].out, targets[i].ldo, accumulate,
                     stream_);
    check_launch("sum_halves");
  }
}

// out[n, m] (row stride ldo) (+)= xb[n, k] · wᵀ; cuBLAS sees the row-major product as
// the column-major outᵀ[m, n] = W[k, m]ᵀ · xᵀ[k, n].
void CudaBackend::gemm_raw(const cuda::Bf16* xb, int64_t n, int64_t k, const Tensor& w, float* out, int64_t ldo,
                           bool accumulate, Gemm gemm) {
  const int64_t m = w.dim(0);
  const float one = 1.0f, zero = 0.0f;
  if (gemm == Gemm::kPromptFixed)
    prompt_gemm_->run(xb, n, k, bf16_data(w, "matmul"), m, out, ldo, accumulate);
  else if (gemm == Gemm::kDecodeFixed)
    decode_gemm_->run(xb, n, k, bf16_data(w, "matmul"), m, out, ldo, accumulate);
  else
    check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                       &one, bf16_data(w, "matmul"), CUDA_R_16BF, static_cast<int>(k), xb, CUDA_R_16BF,
                       static_cast<int>(k), accumulate ? &one : &zero, out, CUDA_R_32F, static_cast<int>(ldo),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  if (timer_.enabled()) timer_.mark("gemm " + std::to_string(n) + "x" + std::to_string(m) + "x" + std::to_string(k));
}

void CudaBackend::gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld,
                                   Activation act, float* out, int64_t ldo) {
  cuda::gated_activation(gate, up, n, width, ld, act, out, ldo, stream_);
  check_launch("gated_activation");
}

}  // namespace kettle
