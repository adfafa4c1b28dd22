#include "backend/cuda/fixed_gemm.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/log.h"

namespace kettle::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kCandidates = 32;
constexpr int64_t kProbeRows = 16;   // rows a bucket's candidate is compared on
constexpr int64_t kMostRows = 1024;  // the last bucket serves up to this many rows

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorCategory::kInternal, "cuBLASLt: {} failed: {}", what, cublasGetStatusString(status));
}

cudaDataType_t operand_type(GemmOperands operands) {
  return operands == GemmOperands::kBf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
}

// The column-major views cuBLASLt takes of the row-major product: outᵀ[m, n] = W[k, m]ᵀ · xᵀ[k, n].
struct Layouts {
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
  Layouts(GemmOperands operands, int64_t m, int64_t n, int64_t k, int64_t ldo) {
    const cudaDataType_t type = operand_type(operands);
    check(cublasLtMatrixLayoutCreate(&w, type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&x, type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&out, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldo),
          "cublasLtMatrixLayoutCreate");
  }
  ~Layouts() {
    cublasLtMatrixLayoutDestroy(w);
    cublasLtMatrixLayoutDestroy(x);
    cublasLtMatrixLayoutDestroy(out);
  }
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
};

int splits(const cublasLtMatmulAlgo_t& algo) {
  int32_t value = 0;
  size_t written = 0;
  check(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &value, sizeof value, &written),
        "cublasLtMatmulAlgoConfigGetAttribute");
  return value;
}

// The largest power of two up to 16 dividing a pointer and its row stride in bytes.
uint32_t alignment_of(const void* p, int64_t row_bytes) {
  const auto bits = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(row_bytes);
  uint32_t a = 16;
  while (a > 1 && bits % a != 0) a /= 2;
  return a;
}

}  // namespace

FixedGemm::FixedGemm(cudaStream_t stream, int64_t plan_rows, bool unsplit_first, std::vector<int64_t> bucket_rows,
                     GemmOperands operands)
    : stream_(stream),
      plan_rows_(plan_rows),
      unsplit_first_(unsplit_first),
      bucket_rows_(operands == GemmOperands::kBf16 ? std::move(bucket_rows) : std::vector<int64_t>{}),
      operands_(operands) {
  check(cublasLtCreate(&handle_), "cublasLtCreate");
  check(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
        "cublasLtMatmulDescSetAttribute");
  check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep),
        "cublasLtMatmulDescSetAttribute");
  if (fp8()) {  // A is the weight, B is x
    const bool blocks = operands == GemmOperands::kFp8Blocks;
    const cublasLtMatmulMatrixScale_t w_mode =
        blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const cublasLtMatmulMatrixScale_t x_mode =
        blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &w_mode, sizeof w_mode),
          "cublasLtMatmulDescSetAttribute");
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &x_mode, sizeof x_mode),
          "cublasLtMatmulDescSetAttribute");
  }
  // A fixed workspace, so GEMMs may be recorded in a graph.
  if (cudaMalloc(&workspace_, kWorkspaceBytes) != cudaSuccess)
    fail(ErrorCategory::kInternal, "CUDA: cudaMalloc (cuBLASLt workspace) failed");
}

FixedGemm::~FixedGemm() {
  cudaFree(workspace_);
  cublasLtMatmulDescDestroy(op_);
  cublasLtDestroy(handle_);
}

bool FixedGemm::applicable(const cublasLtMatmulAlgo_t& algo, int64_t m, int64_t n, int64_t k, int64_t ldo) {
  Layouts l(operands_, m, n, k, ldo);
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(handle_, op_, l.w, l.x, l.out, l.out, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= kWorkspaceBytes;
}

// cuBLASLt's candidates for `rows` rows of a shape, best first.
std::vector<cublasLtMatmulAlgo_t> FixedGemm::candidates(int64_t m, int64_t rows, int64_t k, int64_t ldo,
                                                        uint32_t alignment) {
  Layouts l(operands_, m, rows, k, ldo);
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t bytes = kWorkspaceBytes;
  check(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes),
      "cublasLtMatmulPreferenceSetAttribute");
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment),
          "cublasLtMatmulPreferenceSetAttribute");
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, op_, l.w, l.x, l.out, l.out, preference,
                                                               kCandidates, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(preference);
  check(status, "cublasLtMatmulAlgoGetHeuristic");
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) algos.push_back(results[static_cast<size_t>(i)].algo);
  return algos;
}

bool FixedGemm::offers(int64_t m, int64_t k) {
  const auto key = std::make_pair(m, k);
  if (auto it = offered_.find(key); it != offered_.end()) return it->second;
  bool found = false;
  try {
    found = !candidates(m, plan_rows_, k, m, 16).empty();
  } catch (const Error&) {  // the heuristic refused the descriptor (an unknown scale mode)
  }
  return offered_[key] = found;
}

// The shape's reference configuration: cuBLASLt's best for plan_rows_ rows (unsplit
// first, if asked) that runs for one row and for plan_rows_ alike.
FixedGemm::Plan& FixedGemm::plan(int64_t m, int64_t k, int64_t ldo, uint32_t alignment) {
  const auto key = std::make_tuple(m, k, alignment);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  const std::vector<cublasLtMatmulAlgo_t> found = candidates(m, plan_rows_, k, ldo, alignment);
  // Unsplit k first; a split one is fixed too (its partial sums meet in a fixed order),
  // for shapes cuBLASLt offers nothing else.
  const int64_t fewest = fp8() ? 8 : 1;  // FP8: x's rows come in eights
  for (int pass = 0; pass < 2; ++pass)
    for (const cublasLtMatmulAlgo_t& algo : found) {
      const bool wanted = unsplit_first_ ? (splits(algo) > 1) == (pass == 1) : pass == 0;
      if (!wanted || !applicable(algo, m, fewest, k, ldo) || !applicable(algo, m, plan_rows_, k, ldo)) continue;
      Plan plan{algo, std::vector<std::optional<cublasLtMatmulAlgo_t>>(bucket_rows_.size()), bucket_rows_.empty()};
      return plans_.emplace(key, std::move(plan)).first->second;
    }
  fail(ErrorCategory::kInternal,
       "cuBLASLt offers no GEMM for a {}x{} {} weight (output row stride {}, alignment {}; {} candidates)", m, k,
       fp8() ? "FP8" : "bf16", ldo, alignment, found.size());
}

// Each bucket's first candidate (in cuBLASLt's order) that runs for all its row counts
// and gives the reference's bits on kProbeRows random rows through the shape's weights.
void FixedGemm::probe_buckets(Plan& plan, const void* w, int64_t m, int64_t k, int64_t ldo, uint32_t alignment) {
  plan.probed = true;
  if (!applicable(plan.algo, m, kProbeRows, k, ldo)) return;
  std::vector<uint16_t> host_x(static_cast<size_t>(kProbeRows * k));
  uint32_t state = 0x9e3779b9u;
  for (auto& v : host_x) {  // bf16 of either sign, magnitudes 2^-9 … 2^7, random mantissas
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint16_t>(0x3b00u + ((state >> 16) & 0x7ffu)) | static_cast<uint16_t>((state & 0x100u) << 7);
  }
  const size_t x_bytes = host_x.size() * 2, out_bytes = static_cast<size_t>(kProbeRows * ldo) * sizeof(float);
  void *x = nullptr, *reference = nullptr, *candidate = nullptr;
  if (cudaMalloc(&x, x_bytes) != cudaSuccess || cudaMalloc(&reference, out_bytes) != cudaSuccess ||
      cudaMalloc(&candidate, out_bytes) != cudaSuccess) {
    cudaGetLastError();  // no memory to spare: every bucket keeps the reference
    cudaFree(x), cudaFree(reference), cudaFree(candidate);
    return;
  }
  const auto run_to_host = [&](const cublasLtMatmulAlgo_t& algo, void* out) {
    matmul(algo, x, kProbeRows, k, w, m, static_cast<float*>(out), ldo, false, {});
    std::vector<float> host(static_cast<size_t>(kProbeRows * ldo));
    if (cudaMemcpyAsync(host.data(), out, out_bytes, cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess)
      fail(ErrorCategory::kInternal, "CUDA: a GEMM configuration probe failed");
    return host;
  };
  const auto same_bits = [&](const std::vector<float>& a, const std::vector<float>& b) {
    for (int64_t t = 0; t < kProbeRows; ++t)
      if (std::memcmp(a.data() + t * ldo, b.data() + t * ldo, static_cast<size_t>(m) * sizeof(float)) != 0)
        return false;
    return true;
  };
  cudaMemcpyAsync(x, host_x.data(), x_bytes, cudaMemcpyHostToDevice, stream_);
  const std::vector<float> expected = run_to_host(plan.algo, reference);
  for (size_t b = 0; b < bucket_rows_.size(); ++b) {
    const int64_t first = b == 0 ? 1 : bucket_rows_[b - 1] + 1;
    const int64_t last = b + 1 == bucket_rows_.size() ? kMostRows : bucket_rows_[b];
    for (const cublasLtMatmulAlgo_t& algo : candidates(m, bucket_rows_[b], k, ldo, alignment)) {
      if (!applicable(algo, m, first, k, ldo) || !applicable(algo, m, last, k, ldo) ||
          !applicable(algo, m, kProbeRows, k, ldo))
        continue;
      if (same_bits(run_to_host(algo, candidate), expected)) {
        plan.bucket_algo[b] = algo;
        break;
      }
    }
  }
  cudaFree(x), cudaFree(reference), cudaFree(candidate);
  std::string matched;
  for (size_t b = 0; b < bucket_rows_.size(); ++b)
    matched += fmt::format(" {}:{}", bucket_rows_[b], plan.bucket_algo[b] ? "own" : "reference");
  log::debug("fixed GEMM {}x{}: row buckets{}", m, k, matched);
}

// The configuration for n rows: the bucket's own where it matched, else the reference.
const cublasLtMatmulAlgo_t& FixedGemm::algo_for(const Plan& plan, int64_t n) const {
  if (n > kMostRows) return plan.algo;
  for (size_t b = 0; b < bucket_rows_.size(); ++b)
    if (n <= bucket_rows_[b] || b + 1 == bucket_rows_.size())
      return plan.bucket_algo[b] ? *plan.bucket_algo[b] : plan.algo;
  return plan.algo;
}

void FixedGemm::matmul(const cublasLtMatmulAlgo_t& algo, const void* x, int64_t n, int64_t k, const void* w,
                       int64_t m, float* out, int64_t ldo, bool accumulate, GemmScales scales) {
  Layouts l(operands_, m, n, k, ldo);
  if (fp8()) {
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.w, sizeof scales.w),
          "cublasLtMatmulDescSetAttribute");
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.x, sizeof scales.x),
          "cublasLtMatmulDescSetAttribute");
  }
  const float one = 1.0f, zero = 0.0f;
  check(cublasLtMatmul(handle_, op_, &one, w, l.w, x, l.x, accumulate ? &one : &zero, out, l.out, out, l.out, &algo,
                       workspace_, kWorkspaceBytes, stream_),
        "cublasLtMatmul");
}

void FixedGemm::run(const void* x, int64_t n, int64_t k, const void* w, int64_t m, float* out, int64_t ldo,
                    bool accumulate, GemmScales scales) {
  const int64_t row_bytes = k * (fp8() ? 1 : 2);
  const uint32_t alignment =
      std::min({alignment_of(x, row_bytes), alignment_of(w, row_bytes), alignment_of(out, ldo * 4)});
  Plan& p = plan(m, k, ldo, alignment);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!p.probed && cudaStreamIsCapturing(stream_, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone)
    probe_buckets(p, w, m, k, ldo, alignment);
  matmul(algo_for(p, n), x, n, k, w, m, out, ldo, accumulate, scales);
}

}  // namespace kettle::cuda
