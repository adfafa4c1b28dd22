// RMSNorm (plain and fused with the residual add), the embedding gather and
// the small elementwise ops. One block per row; sums of squares in f32.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kNormThreads = 512;

__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const float* x, int64_t dim, int64_t ld,
                                                                const float* __restrict__ w, float eps, bool add_one,
                                                                float* out, int64_t ldo) {
  grid_wait();
  const float* xr = x + blockIdx.x * ld;
  float* o = out + blockIdx.x * ldo;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (add_one ? 1.0f + w[i] : w[i]) * (xr[i] * inv);
}

__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(float* x, const float* __restrict__ y, int64_t dim,
                                                                    const float* __restrict__ w, float eps,
                                                                    bool add_one, float* out) {
  grid_wait();
  float* xr = x + blockIdx.x * dim;
  const float* yr = y + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] + yr[i];
    xr[i] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (add_one ? 1.0f + w[i] : w[i]) * (xr[i] * inv);
}

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void embed_kernel(const int32_t* __restrict__ ids, const Bf16Bits* __restrict__ table, int64_t dim,
                             float scale, float* out) {
  grid_wait();
  const Bf16Bits* row = table + static_cast<int64_t>(ids[blockIdx.x]) * dim;
  float* o = out + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __uint_as_float(static_cast<uint32_t>(row[i]) << 16) * scale;
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, float eps, bool add_one,
              float* out, int64_t ldo, cudaStream_t stream) {
  launch(rms_norm_kernel, static_cast<unsigned>(rows), kNormThreads, 0, stream, x, dim, ld, w, eps, add_one, out, ldo);
}

void add_rms_norm(float* x, const float* y, int64_t rows, int64_t dim, const float* w, float eps, bool add_one,
                  float* out, cudaStream_t stream) {
  launch(add_rms_norm_kernel, static_cast<unsigned>(rows), kNormThreads, 0, stream, x, y, dim, w, eps, add_one, out);
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  launch(add_kernel, blocks_for(n, 256), 256, 0, stream, x, y, n);
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  launch(softcap_kernel, blocks_for(n, 256), 256, 0, stream, x, n, cap);
}

void embed(const int32_t* ids, int64_t n, const Bf16* table, int64_t dim, float scale, float* out,
           cudaStream_t stream) {
  launch(embed_kernel, static_cast<unsigned>(n), 256, 0, stream, ids, table, dim, scale, out);
}

}  // namespace kettle::cuda
