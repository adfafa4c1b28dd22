#include "backend/cuda/fixed_gemm.h"

#include <algorithm>
#include <array>

#include "util/error.h"

namespace kettle::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kCandidates = 32;

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(ErrorCategory::kInternal, "cuBLASLt: {} failed: {}", what, cublasGetStatusString(status));
}

// The column-major views cuBLASLt takes of the row-major product: outᵀ[m, n] = W[k, m]ᵀ · xᵀ[k, n].
struct Layouts {
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
  Layouts(int64_t m, int64_t n, int64_t k, int64_t ldo) {
    check(cublasLtMatrixLayoutCreate(&w, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&x, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
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

FixedGemm::FixedGemm(cudaStream_t stream, int64_t plan_rows, bool unsplit_first)
    : stream_(stream), plan_rows_(plan_rows), unsplit_first_(unsplit_first) {
  check(cublasLtCreate(&handle_), "cublasLtCreate");
  check(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
        "cublasLtMatmulDescSetAttribute");
  check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep),
        "cublasLtMatmulDescSetAttribute");
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
  Layouts l(m, n, k, ldo);
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(handle_, op_, l.w, l.x, l.out, l.out, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= kWorkspaceBytes;
}

// The shape's configuration: cuBLASLt's best for plan_rows_ rows (unsplit first, if asked)
// that runs for one row and for plan_rows_ alike.
const FixedGemm::Plan& FixedGemm::plan(int64_t m, int64_t k, int64_t ldo, uint32_t alignment) {
  const auto key = std::make_tuple(m, k, alignment);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Layouts l(m, plan_rows_, k, ldo);
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
  // Unsplit k first; a split one is fixed too (its partial sums meet in a fixed order),
  // for shapes cuBLASLt offers nothing else.
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < found; ++i) {
      const cublasLtMatmulAlgo_t& algo = results[static_cast<size_t>(i)].algo;
      const bool wanted = unsplit_first_ ? (splits(algo) > 1) == (pass == 1) : pass == 0;
      if (!wanted || !applicable(algo, m, 1, k, ldo) || !applicable(algo, m, plan_rows_, k, ldo)) continue;
      return plans_.emplace(key, Plan{algo}).first->second;
    }
  fail(ErrorCategory::kInternal,
       "cuBLASLt offers no GEMM for a {}x{} bf16 weight (output row stride {}, alignment {}; {} candidates)", m, k, ldo,
       alignment, found);
}

void FixedGemm::run(const uint16_t* x, int64_t n, int64_t k, const uint16_t* w, int64_t m, float* out, int64_t ldo,
                     bool accumulate) {
  const uint32_t alignment = std::min({alignment_of(x, k * 2), alignment_of(w, k * 2), alignment_of(out, ldo * 4)});
  const Plan& p = plan(m, k, ldo, alignment);
  Layouts l(m, n, k, ldo);
  const float one = 1.0f, zero = 0.0f;
  check(cublasLtMatmul(handle_, op_, &one, w, l.w, x, l.x, accumulate ? &one : &zero, out, l.out, out, l.out, &p.algo,
                       workspace_, kWorkspaceBytes, stream_),
        "cublasLtMatmul");
}

}  // namespace kettle::cuda
