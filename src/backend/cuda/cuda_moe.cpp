// CudaBackend::moe: router logits, top-k on the device, and expert GEMVs read
// through a device table of pointers (no host round trip).
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {

void CudaBackend::moe(const float* x, int64_t n, int64_t hidden, const Tensor& router,
                      const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) {
  const int n_experts = static_cast<int>(router.dim(0));
  const int64_t inter = experts.at(0).gate.dim(0);
  const int k = params.top_k;
  // workspace: router logits [n, E] | weights [n, k] | ids [n, k] | h [n, k, inter]
  const size_t logits_bytes = static_cast<size_t>(n * n_experts) * 4, pair_bytes = static_cast<size_t>(n * k) * 4;
  auto* base =
      static_cast<char*>(grow(moe_ws_, logits_bytes + 2 * pair_bytes + static_cast<size_t>(n * k * inter) * 4 + 1024));
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

// Device table [gate pointers | up pointers | down pointers] for one layer's experts.
const cuda::Bf16** CudaBackend::expert_table(const std::vector<ExpertWeights>& experts) {
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

}  // namespace kettle
