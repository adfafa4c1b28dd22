// FP8 e4m3 weights on CUDA: x quantized to FP8 for the tensor-core GEMMs
// (fixed_gemm.h's FP8 operands), the weights dequantized to bf16 hi + lo blocks
// for the exact path, and the embedding gather.
//
// x is quantized as transformers' FP8Linear and DeepSeek's reference quantize
// activations: per row and per 128 columns (or per whole row, for weights with a
// scale per row), s = amax / 448 and q = e4m3(x / s), rounded to nearest even.
#include <cuda_fp8.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr float kFp8Max = 448.0f;
constexpr int kBlock = 128;  // columns per scale of x (kFp8Blocks)

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float from_e4m3(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float scale_for(float amax) { return amax > 0.0f ? amax / kFp8Max : 1.0f; }

// One warp per (row, 128 columns): 4 columns a lane. Rows past `rows` (up to padded) are
// zero with scale 1. scales: [k / 128, padded_rows rounded up to 4].
__global__ void quantize_blocks_kernel(const float* __restrict__ x, int64_t rows, int64_t padded, int64_t ldx,
                                       int64_t k, uint8_t* __restrict__ codes, float* __restrict__ scales,
                                       int64_t scale_ld) {
  grid_wait();
  const int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t blocks = k / kBlock;
  if (w >= padded * blocks) return;
  const int64_t r = w / blocks, b = w % blocks, c = b * kBlock + lane * 4;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (r < rows) v = make_float4(x[r * ldx + c], x[r * ldx + c + 1], x[r * ldx + c + 2], x[r * ldx + c + 3]);
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float s = scale_for(amax);
  const uint32_t q = to_e4m3(v.x / s) | (to_e4m3(v.y / s) << 8) | (to_e4m3(v.z / s) << 16) |
                     (static_cast<uint32_t>(to_e4m3(v.w / s)) << 24);
  *reinterpret_cast<uint32_t*>(codes + r * k + c) = q;
  if (lane == 0) scales[b * scale_ld + r] = s;
}

// One block per row (kFp8Rows): the row's amax, then its codes.
__global__ void quantize_rows_kernel(const float* __restrict__ x, int64_t rows, int64_t ldx, int64_t k,
                                     uint8_t* __restrict__ codes, float* __restrict__ scales) {
  grid_wait();
  const int64_t r = blockIdx.x;
  float amax = 0.0f;
  if (r < rows)
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(x[r * ldx + c]));
  __shared__ float partial[32];
  amax = warp_max(amax);
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = amax;
  __syncthreads();
  for (unsigned wi = 0; wi < blockDim.x / kWarp; ++wi) amax = fmaxf(amax, partial[wi]);
  const float s = scale_for(amax);
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) codes[r * k + c] = r < rows ? to_e4m3(x[r * ldx + c] / s) : 0;
  if (threadIdx.x == 0) scales[r] = s;
}

__device__ __forceinline__ float fp8_value(const Fp8Weights& w, int64_t r, int64_t c, int64_t k) {
  return from_e4m3(w.codes[r * k + c]) * w.scales[(r / w.block_rows) * w.scale_ld + c / w.block_cols];
}

// Eight consecutive elements of a row a thread (one 16-byte store): part 0 the bf16 rounding
// of code · scale, part 1 what that rounding left out.
__global__ void fp8_dequantize_kernel(Fp8Weights w, int64_t row0, int64_t rows, int64_t k, int part,
                                      __nv_bfloat16* __restrict__ out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // one run of 8
  if (i >= rows * k / 8) return;
  const int64_t r = i / (k / 8), c0 = i % (k / 8) * 8;
  float value[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) value[e] = fp8_value(w, row0 + r, c0 + e, k);
  store_bf16_part(value, part, out + r * k + c0);
}

__global__ void fp8_embed_kernel(const int32_t* __restrict__ ids, int64_t n, Fp8Weights w, int64_t dim, float scale,
                                 float* __restrict__ out) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  out[i] = fp8_value(w, ids[i / dim], i % dim, dim) * scale;
}

__global__ void add_rows_kernel(const float* __restrict__ src, int64_t n, int64_t m, float* __restrict__ out,
                                int64_t ldo, int accumulate) {
  grid_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * m) return;
  float* o = out + (i / m) * ldo + i % m;
  *o = accumulate ? *o + src[i] : src[i];
}

}  // namespace

bool fp8_shape_supported(bool row_scales, int64_t rows, int64_t k) {
  return rows % 16 == 0 && k % 16 == 0 && (row_scales || k % kBlock == 0) && rows < (int64_t{1} << 31);
}

int64_t fp8_x_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }

void fp8_quantize_x(const float* x, int64_t rows, int64_t padded, int64_t ldx, int64_t k, bool row_scales,
                    uint8_t* codes, float* scales, cudaStream_t stream) {
  if (row_scales) {
    launch(quantize_rows_kernel, static_cast<unsigned>(padded), 256, 0, stream, x, rows, ldx, k, codes, scales);
    return;
  }
  launch(quantize_blocks_kernel, blocks_for(padded * (k / kBlock) * kWarp, 256), 256, 0, stream, x, rows, padded, ldx,
         k, codes, scales, fp8_x_scale_ld(padded));
}

void fp8_dequantize(const Fp8Weights& w, int64_t row0, int64_t rows, int64_t k, int part, Bf16* out,
                    cudaStream_t stream) {
  launch(fp8_dequantize_kernel, blocks_for(rows * k / 8, 256), 256, 0, stream, w, row0, rows, k, part,
         reinterpret_cast<__nv_bfloat16*>(out));
}

void fp8_embed(const int32_t* ids, int64_t n, const Fp8Weights& w, int64_t dim, float scale, float* out,
               cudaStream_t stream) {
  launch(fp8_embed_kernel, blocks_for(n * dim, 256), 256, 0, stream, ids, n, w, dim, scale, out);
}

void add_rows(const float* src, int64_t n, int64_t m, float* out, int64_t ldo, bool accumulate, cudaStream_t stream) {
  launch(add_rows_kernel, blocks_for(n * m, 256), 256, 0, stream, src, n, m, out, ldo, accumulate ? 1 : 0);
}

}  // namespace kettle::cuda
