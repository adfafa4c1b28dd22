// CudaBackend::moe: router logits and top-k on the device for every row; the
// step's decode rows (StepContext::decode_rows) through expert GEMVs, the
// prompt rows through grouped GEMMs (moe_grouped.cu), both reading the experts
// through a device table of pointers (no host round trip). A row's kernels
// depend on its kind, never on the batch, so its bits do not either.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {
namespace {

// Prompt rows per grouped pass: bounds the per-pair workspace (h and y: a 2,048-row pass
// of a 30B-A3B shape holds about 180 MB), while every pass still reads each chosen
// expert once per 64 rows routed to it.
constexpr int64_t kGroupedRows = 2048;

}  // namespace

void CudaBackend::moe(const float* x, int64_t n, int64_t hidden, const Linear& router,
                      const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) {
  const int n_experts = static_cast<int>(router.out_features());
  const int64_t inter = experts.at(0).gate.out_features();
  const int k = params.top_k;
  if (n_experts > cuda::kMaxRoutedExperts || k < 1 || k > n_experts)
    fail(ErrorCategory::kUnsupported, "cuda moe: {} experts, top {} (at most {} experts, 1 ≤ top-k ≤ experts)",
         n_experts, k, cuda::kMaxRoutedExperts);
  const bool grouped = cuda::moe_grouped_supported(hidden, inter);
  const int64_t d = grouped ? std::min(n, context_.decode_rows) : n;  // rows through the GEMVs
  const int64_t pass = std::min(n - d, kGroupedRows);
  // workspace: router logits [n, E] | weights [n, k] | ids [n, k] | h [rows, k, inter] for the
  // decode rows or one grouped pass, whichever is more | the grouped pass's own
  const size_t logits_bytes = round_up(static_cast<size_t>(n * n_experts) * 4);
  const size_t pair_bytes = round_up(static_cast<size_t>(n * k) * 4);
  const size_t h_bytes = round_up(static_cast<size_t>(std::max(d, pass) * k * inter) * 4);
  const size_t grouped_bytes =
      pass > 0 ? static_cast<size_t>(cuda::moe_grouped_workspace_bytes(pass, k, n_experts, hidden)) : 0;
  auto* base = static_cast<char*>(grow(moe_ws_, logits_bytes + 2 * pair_bytes + h_bytes + grouped_bytes));
  auto* logits = reinterpret_cast<float*>(base);
  auto* weights = reinterpret_cast<float*>(base + logits_bytes);
  auto* ids = reinterpret_cast<int32_t*>(base + logits_bytes + pair_bytes);
  auto* h = reinterpret_cast<float*>(base + logits_bytes + 2 * pair_bytes);
  void* grouped_ws = base + logits_bytes + 2 * pair_bytes + h_bytes;
  cuda::router_logits(x, n, hidden, bf16_data(router.weight, "moe"), n_experts, logits, stream_);
  check_launch("router_logits");
  cuda::route_top_k(logits, n, n_experts, k, params.renormalize, ids, weights, stream_);
  check_launch("route_top_k");
  const auto** table = expert_table(experts);
  if (d > 0) {
    cuda::moe_gate_up(x, d, hidden, ids, k, table, table + n_experts, inter, params.act, h, stream_);
    check_launch("moe_gate_up");
    cuda::moe_down(h, d, inter, ids, weights, k, table + 2 * n_experts, hidden, out, stream_);
    check_launch("moe_down");
  }
  for (int64_t r = d; r < n; r += pass) {
    const int64_t rows = std::min(pass, n - r);
    cuda::moe_grouped(x + r * hidden, rows, hidden, ids + r * k, weights + r * k, k, n_experts, table, inter,
                      params.act, h, out + r * hidden, grouped_ws, stream_);
    check_launch("moe_grouped");
  }
}

// Device table [gate pointers | up pointers | down pointers] for one layer's experts.
const cuda::Bf16** CudaBackend::expert_table(const std::vector<ExpertWeights>& experts) {
  const void* key = experts.front().gate.weight.data;  // a layer's experts, by their resident address
  auto it = expert_tables_.find(key);
  if (it == expert_tables_.end()) {
    const size_t e = experts.size();
    std::vector<const cuda::Bf16*> host(3 * e);
    for (size_t i = 0; i < e; ++i) {
      host[i] = bf16_data(experts[i].gate.weight, "moe");
      host[e + i] = bf16_data(experts[i].up.weight, "moe");
      host[2 * e + i] = bf16_data(experts[i].down.weight, "moe");
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
