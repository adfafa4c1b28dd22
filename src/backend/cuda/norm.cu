// RMSNorm (plain and fused with the residual add), the embedding gather and
// the small elementwise ops. One block per row; sums of squares in f32; a row
// that fits (≤ 16384 floats, 16-byte aligned) is read once into registers.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kNormThreads = 512;
constexpr int kNormLoads = 8;  // float4s of a row per thread on the register path: dim ≤ 16384

// The normalised values as f32, or rounded to bf16 for a GEMM's activation operand.
__device__ __forceinline__ void store(float* out, int64_t i, float v) {
  out[i] = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* out, int64_t i, float v) {
  out[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store4(float* out, int i, float4 v) {
  reinterpret_cast<float4*>(out)[i] = v;
}
__device__ __forceinline__ void store4(__nv_bfloat16* out, int i, float4 v) {
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
  o[0] = __floats2bfloat162_rn(v.x, v.y);
  o[1] = __floats2bfloat162_rn(v.z, v.w);
}

// A row's sum of squares and scaled output, the row held in registers: the norm weight is
// loaded before grid_wait (weights never depend on the previous kernel), the row once.
// For rows of a multiple of 4 floats with 16-byte aligned starts; add: x += y first (and
// written back). Sums run in a fixed order per row, the same for any row count.
template <bool kAdd, typename Out>
__device__ __forceinline__ void norm_row_registers(float* x, const float* __restrict__ y, int64_t dim,
                                                   const float* __restrict__ w, float eps, bool add_one, Out* out) {
  const int n4 = static_cast<int>(dim / 4);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 wv[kNormLoads], xv[kNormLoads];
#pragma unroll
  for (int j = 0; j < kNormLoads; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i < n4) wv[j] = __ldg(w4 + i);
  }
  grid_wait();
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormLoads; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= n4) continue;
    float4 v = reinterpret_cast<const float4*>(x)[i];
    if constexpr (kAdd) {
      const float4 d = reinterpret_cast<const float4*>(y)[i];
      v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
      reinterpret_cast<float4*>(x)[i] = v;
    }
    xv[j] = v;
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    ss = fmaf(v.w, v.w, ss);
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  const auto scale = [&](float wi, float xi) { return (add_one ? 1.0f + wi : wi) * (xi * inv); };
#pragma unroll
  for (int j = 0; j < kNormLoads; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= n4) continue;
    store4(out, i,
           make_float4(scale(wv[j].x, xv[j].x), scale(wv[j].y, xv[j].y), scale(wv[j].z, xv[j].z),
                       scale(wv[j].w, xv[j].w)));
  }
}

// Any row: element by element, twice over the row.
template <bool kAdd, typename Out>
__device__ __forceinline__ void norm_row_strided(float* x, const float* __restrict__ y, int64_t dim,
                                                 const float* __restrict__ w, float eps, bool add_one, Out* out) {
  grid_wait();
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = x[i];
    if constexpr (kAdd) {
      v += y[i];
      x[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) store(out, i, (add_one ? 1.0f + w[i] : w[i]) * (x[i] * inv));
}

// One block per row: out = norm(x) (kAdd: x += y first; y and out dense like x).
template <bool kAdd, bool kRegisters, typename Out>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(float* x, int64_t dim, int64_t ld, const float* __restrict__ y, const float* __restrict__ w,
                    float eps, bool add_one, Out* out, int64_t ldo) {
  float* xr = x + blockIdx.x * ld;
  const float* yr = kAdd ? y + blockIdx.x * ld : nullptr;
  Out* o = out + blockIdx.x * ldo;
  if constexpr (kRegisters)
    norm_row_registers<kAdd>(xr, yr, dim, w, eps, add_one, o);
  else
    norm_row_strided<kAdd>(xr, yr, dim, w, eps, add_one, o);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// The register path when every row start is 16-byte aligned and a row fits.
bool registers_fit(const void* x, const void* out, const void* w, int64_t dim, int64_t ld, int64_t ldo) {
  return dim % 4 == 0 && ld % 4 == 0 && ldo % 4 == 0 && dim <= int64_t{4} * kNormLoads * kNormThreads && aligned16(x) &&
         aligned16(out) && aligned16(w);
}

template <bool kAdd, typename Out>
void launch_norm(float* x, int64_t rows, int64_t dim, int64_t ld, const float* y, const float* w, float eps,
                 bool add_one, Out* out, int64_t ldo, cudaStream_t stream) {
  const bool registers = registers_fit(x, out, w, dim, ld, ldo) && (!kAdd || aligned16(y));
  const auto kernel = registers ? rms_norm_kernel<kAdd, true, Out> : rms_norm_kernel<kAdd, false, Out>;
  launch(kernel, static_cast<unsigned>(rows), kNormThreads, 0, stream, x, dim, ld, y, w, eps, add_one, out, ldo);
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
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    o[i] = __uint_as_float(static_cast<uint32_t>(row[i]) << 16) * scale;
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, float eps, bool add_one,
              float* out, int64_t ldo, cudaStream_t stream) {
  // kAdd is off: x is only read.
  launch_norm<false>(const_cast<float*>(x), rows, dim, ld, nullptr, w, eps, add_one, out, ldo, stream);
}

void rms_norm_bf16(const float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, float eps, bool add_one,
                   Bf16* out, cudaStream_t stream) {
  launch_norm<false>(const_cast<float*>(x), rows, dim, ld, nullptr, w, eps, add_one,
                     reinterpret_cast<__nv_bfloat16*>(out), dim, stream);
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
