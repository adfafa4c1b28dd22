// PromptGemm: the prompt rows' weight matmuls, cuBLASLt bf16 GEMMs with f32
// output, each weight shape bound to one kernel configuration (chosen once, for
// a prompt of a few hundred rows, without split-K where cuBLASLt offers one)
// that every later call of that shape runs whatever its row count. cuBLAS's own choice changes with the row count
// and so changes the order of the sums; a fixed configuration sums each output
// over k the same way for any number of rows, so a prompt's rows get the same
// bits however the engine chunks and batches them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace kettle::cuda {

class PromptGemm {
 public:
  explicit PromptGemm(cudaStream_t stream);
  ~PromptGemm();
  PromptGemm(const PromptGemm&) = delete;
  PromptGemm& operator=(const PromptGemm&) = delete;

  // out[n, m] (row stride ldo) (+)= x[n, k] (bf16, dense) · w[m, k]ᵀ (bf16).
  void run(const uint16_t* x, int64_t n, int64_t k, const uint16_t* w, int64_t m, float* out, int64_t ldo,
           bool accumulate);

 private:
  // The configuration of one weight shape (m, k).
  struct Plan {
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t m, int64_t k, int64_t ldo, uint32_t alignment);
  bool applicable(const cublasLtMatmulAlgo_t& algo, int64_t m, int64_t n, int64_t k, int64_t ldo);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;  // Wᵀ · x, f32 compute
  void* workspace_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, Plan> plans_;  // by (m, k, operand alignment)
};

}  // namespace kettle::cuda
