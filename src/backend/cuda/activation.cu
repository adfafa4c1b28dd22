// Gated MLP activation for prefill (decode fuses it into the gate/up GEMV):
// out = act(gate) * up, the formulas of cpu/activation.cpp.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

__global__ void gated_activation_kernel(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld,
                                        Activation act, float* out, int64_t ldo) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, c = i % width;
  const float g = gate[t * ld + c], u = up[t * ld + c];
  out[t * ldo + c] = activate(act, g) * u;
}

}  // namespace

void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld, Activation act,
                      float* out, int64_t ldo, cudaStream_t stream) {
  launch(gated_activation_kernel, blocks_for(n * width, 256), 256, 0, stream, gate, up, n, width, ld, act, out, ldo);
}

}  // namespace kettle::cuda
