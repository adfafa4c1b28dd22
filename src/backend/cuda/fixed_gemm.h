// FixedGemm: weight matmuls as cuBLASLt GEMMs with f32 output (bf16 operands, or
// FP8 e4m3 ones with f32 scales: GemmOperands), each
// weight shape bound to one kernel configuration (chosen once, for a given row
// count) that every later call of that shape runs whatever its row count.
// cuBLAS's own choice changes with the row count and so changes the order of
// the sums; a fixed configuration (its tile, its k split, its reduction) sums
// each output the same way for any number of rows, so a row gets the same bits
// alone or batched. The CUDA backend keeps one for prompt rows and one for
// decode rows under --batch-invariant.
//
// Row buckets: a configuration chosen for another row count (a larger tile for a
// large batch) may sum every output in the very same order as the reference
// configuration (no k split, the same instruction, k walked the same way). When
// a shape is first run, each bucket's candidates are run beside the reference
// on the shape's own weights and random rows, and the first whose outputs are
// the same bits serves that bucket's row counts; a bucket where none is serves
// with the reference. A row's bits stay the same in any batch either way.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace kettle::cuda {

// The operands' types: bf16 weights and x, or FP8 e4m3 ones with f32 scales — one per
// 128 × 128 block of the weight and per 128 columns of each x row (the block-wise FP8 of
// DeepSeek's and Qwen's checkpoints), or one per weight row and per x row.
enum class GemmOperands { kBf16, kFp8Blocks, kFp8Rows };

// FP8 operands' scales (device memory): the weight's (kFp8Blocks: [ceil(m / 128),
// ldw] row-major, ldw = ceil(k / 128) rounded up to 4; kFp8Rows: [m]) and x's
// (kFp8Blocks: [ceil(k / 128), n rounded up to 4], each 128-column block's n scales
// together; kFp8Rows: [n]), as cuBLASLt's VEC128 / BLK128x128 / OUTER_VEC modes read them.
struct GemmScales {
  const float* w = nullptr;
  const float* x = nullptr;
};

class FixedGemm {
 public:
  // plan_rows: the row count each shape's reference configuration is chosen for;
  // unsplit_first: prefer a configuration that does not split k; bucket_rows: row
  // counts (ascending) whose own configurations may serve n up to each of them (the
  // last: any n above), if they give the reference's bits.
  // Row buckets are probed for bf16 operands only.
  FixedGemm(cudaStream_t stream, int64_t plan_rows, bool unsplit_first, std::vector<int64_t> bucket_rows = {},
            GemmOperands operands = GemmOperands::kBf16);
  ~FixedGemm();
  FixedGemm(const FixedGemm&) = delete;
  FixedGemm& operator=(const FixedGemm&) = delete;

  // Whether cuBLASLt has a configuration for an m × k weight (dense output, 16-byte
  // aligned operands): its FP8 scale modes are not in every version, GPU and shape.
  // Asked once per shape.
  bool offers(int64_t m, int64_t k);

  // out[n, m] (row stride ldo) (+)= x[n, k] (dense) · w[m, k]ᵀ, both of the operands'
  // type (FP8: n a multiple of 8, and their scales).
  void run(const void* x, int64_t n, int64_t k, const void* w, int64_t m, float* out, int64_t ldo, bool accumulate,
           GemmScales scales = {});

 private:
  // The configurations of one weight shape (m, k).
  struct Plan {
    cublasLtMatmulAlgo_t algo{};                                  // the reference
    std::vector<std::optional<cublasLtMatmulAlgo_t>> bucket_algo;  // per bucket: its own, if it matched
    bool probed = false;                                           // buckets decided (not while recording)
  };
  Plan& plan(int64_t m, int64_t k, int64_t ldo, uint32_t alignment);
  bool applicable(const cublasLtMatmulAlgo_t& algo, int64_t m, int64_t n, int64_t k, int64_t ldo);
  std::vector<cublasLtMatmulAlgo_t> candidates(int64_t m, int64_t rows, int64_t k, int64_t ldo, uint32_t alignment);
  void probe_buckets(Plan& plan, const void* w, int64_t m, int64_t k, int64_t ldo, uint32_t alignment);
  const cublasLtMatmulAlgo_t& algo_for(const Plan& plan, int64_t n) const;
  void matmul(const cublasLtMatmulAlgo_t& algo, const void* x, int64_t n, int64_t k, const void* w, int64_t m,
              float* out, int64_t ldo, bool accumulate, GemmScales scales);
  bool fp8() const { return operands_ != GemmOperands::kBf16; }

  cudaStream_t stream_;
  int64_t plan_rows_;
  bool unsplit_first_;
  std::vector<int64_t> bucket_rows_;
  GemmOperands operands_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;  // Wᵀ · x, f32 compute (FP8: with the operands' scale modes)
  void* workspace_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, Plan> plans_;  // by (m, k, operand alignment)
  std::map<std::pair<int64_t, int64_t>, bool> offered_;            // offers(m, k)
};

}  // namespace kettle::cuda
