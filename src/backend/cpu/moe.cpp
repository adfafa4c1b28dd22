// Routed mixture of experts on the CPU (Mixtral, Qwen3-MoE): softmax router,
// top-k, tokens grouped per expert so each expert runs one GEMM over its
// tokens, outputs added in expert order as transformers' index_add_ does.
// Router and experts are dense or affine (MLX) Linears, as cpu_matmul runs them.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "tensor/host_buffer.h"

namespace kettle::cpu {
namespace {

struct Route {
  std::vector<int64_t> tokens;  // which tokens chose this expert
  std::vector<float> weights;   // and with what routing weight
};

std::vector<Route> route_tokens(const float* logits, int64_t n, int n_experts, const MoeParams& params) {
  std::vector<Route> routes(static_cast<size_t>(n_experts));
  std::vector<float> probs(static_cast<size_t>(n_experts));
  std::vector<int> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * n_experts;
    float max_l = *std::max_element(l, l + n_experts);
    float sum = 0.0f;
    for (int e = 0; e < n_experts; ++e) sum += probs[static_cast<size_t>(e)] = std::exp(l[e] - max_l);
    for (auto& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    // torch.topk order: larger first; ties keep the lower index first.
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return probs[static_cast<size_t>(a)] > probs[static_cast<size_t>(b)]; });
    float top_sum = 0.0f;
    for (int i = 0; i < params.top_k; ++i) top_sum += probs[static_cast<size_t>(order[static_cast<size_t>(i)])];
    for (int i = 0; i < params.top_k; ++i) {
      int e = order[static_cast<size_t>(i)];
      float w = probs[static_cast<size_t>(e)];
      if (params.renormalize) w /= top_sum;
      routes[static_cast<size_t>(e)].tokens.push_back(t);
      routes[static_cast<size_t>(e)].weights.push_back(w);
    }
  }
  return routes;
}

}  // namespace

void moe(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, const Linear& router,
         const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) {
  const int n_experts = static_cast<int>(router.out_features());
  HostBuffer<float> logits(static_cast<size_t>(n * n_experts));  // [n, n_experts]
  const MatmulTarget route = matmul_target(router, logits.data(), n_experts);
  cpu_matmul_many(pool, x, n, hidden, &route, 1);
  std::vector<Route> routes = route_tokens(logits.data(), n, n_experts, params);

  std::fill(out, out + n * hidden, 0.0f);
  HostBuffer<float> xs, gate_up, y;
  for (int e = 0; e < n_experts; ++e) {
    const Route& route = routes[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(route.tokens.size());
    if (m == 0) continue;
    const ExpertWeights& ex = experts[static_cast<size_t>(e)];
    const int64_t inter = ex.gate.out_features();
    xs.resize(static_cast<size_t>(m * hidden));            // [m, hidden]
    gate_up.resize(static_cast<size_t>(m * 2 * inter));    // [m, 2 * inter]
    y.resize(static_cast<size_t>(m * hidden));             // [m, hidden]
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(x + route.tokens[static_cast<size_t>(i)] * hidden, hidden, xs.data() + i * hidden);
    const MatmulTarget both[] = {matmul_target(ex.gate, gate_up.data(), 2 * inter),
                                 matmul_target(ex.up, gate_up.data() + inter, 2 * inter)};
    cpu_matmul_many(pool, xs.data(), m, hidden, both, 2);
    gated_activation(pool, gate_up.data(), gate_up.data() + inter, m, inter, 2 * inter, params.act,
                     gate_up.data(), 2 * inter);
    const MatmulTarget down = matmul_target(ex.down, y.data(), hidden);
    cpu_matmul_many(pool, gate_up.data(), m, 2 * inter, &down, 1);
    for (int64_t i = 0; i < m; ++i) {
      float w = route.weights[static_cast<size_t>(i)];
      float* o = out + route.tokens[static_cast<size_t>(i)] * hidden;
      const float* yi = y.data() + i * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[d] += yi[d] * w;
    }
  }
}

}  // namespace kettle::cpu
