// Small device helpers shared by the CUDA kernels: bf16 unpacking, warp and
// block reductions, activations (the same formulas as cpu/activation.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace kettle::cuda {

constexpr int kWarp = 32;
using Bf16Bits = uint16_t;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// bf16 bits → f32: the bits are the top half of the float.
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

// x rounded to bf16 (round to nearest even), back as f32: the activations every weight
// matmul multiplies, GEMV and GEMM alike (cuBLAS takes x as bf16), so a row's sums see
// the same inputs alone or batched.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float4 round_bf16(float4 v) {
  return make_float4(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
}

// Eight bf16 weights (one 16-byte load) dotted with eight f32 activations.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  float s = bf16_lo(w.x) * a.x;
  s = fmaf(bf16_hi(w.x), a.y, s);
  s = fmaf(bf16_lo(w.y), a.z, s);
  s = fmaf(bf16_hi(w.y), a.w, s);
  s = fmaf(bf16_lo(w.z), b.x, s);
  s = fmaf(bf16_hi(w.z), b.y, s);
  s = fmaf(bf16_lo(w.w), b.z, s);
  s = fmaf(bf16_hi(w.w), b.w, s);
  return s;
}

// Eight f32 values as bf16 at out (one 16-byte store): part 0 their rounding, part 1 what
// that rounding left out (two parts that add up to the f32 values within f32's rounding).
__device__ __forceinline__ void store_bf16_part(const float (&value)[8], int part, __nv_bfloat16* out) {
  __align__(16) __nv_bfloat16 v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const __nv_bfloat16 hi = __float2bfloat16_rn(value[e]);
    v[e] = part == 0 ? hi : __float2bfloat16_rn(value[e] - __bfloat162float(hi));
  }
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(v);
}

// Weights are read once per step: stream them past L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0f + expf(-x));
    case Activation::kGeluTanh: {
      const float c = 0.7978845608028654f;  // sqrt(2 / pi)
      return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    case Activation::kGelu:
      return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  }
  return x;
}

// Programmatic dependent launch (Hopper): kernels are launched so they may start
// while the previous kernel finishes; each waits for it (grid_wait) before touching
// activations, and weight loads can be issued before the wait. Every kernel waits
// on every path, so "complete" stays transitive along the stream. (Letting dependents
// launch before the wait was measured: no faster at 8b, 1.5 % slower at 1b decode.)
__device__ __forceinline__ void grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// 16-byte weight loads per lane and batch, over all rows of a warp; two batches are in
// flight, so a warp keeps 4 KB of weights in the air in 32 registers of buffers.
constexpr int kRowLoads = 4;

// Per-lane partial dot products of R bf16 weight rows (k elements each) with f32 x. The
// row's 16-byte chunks are dealt to `workers` lanes (one warp, or several warps of a block
// splitting k); this lane is worker `first` and takes chunks first, first + workers, ...
// Two batches of U loads per row stay in flight: both are issued before grid_wait()
// (weights never depend on the previous kernel), and each batch is reloaded as soon as it
// is consumed, with no register copy between batches that would wait on the loads. Rows
// take the 16-byte path when k is a multiple of 8 and x is 16-byte aligned. With kBf16X
// each x element is rounded to bf16 first (round_bf16).
template <int R, int U, bool kBf16X = false>
__device__ __forceinline__ void rows_dot_part(const Bf16Bits* const (&w_rows)[R], const float* __restrict__ x, int k,
                                              int first, int workers, float (&sums)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) sums[r] = 0.0f;
  if ((k & 7) != 0 || (reinterpret_cast<uintptr_t>(x) & 15) != 0) {
    grid_wait();
    for (int i = first; i < k; i += workers) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        sums[r] = fmaf(__uint_as_float(static_cast<uint32_t>(w_rows[r][i]) << 16), kBf16X ? round_bf16(x[i]) : x[i],
                       sums[r]);
    }
    return;
  }
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int chunks = k / 8, batch = U * workers;
  uint4 a[R][U], b[R][U];
  const auto load = [&](uint4(&dst)[R][U], int c) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int cc = c + u * workers;
        dst[r][u] = cc < chunks ? load_stream(reinterpret_cast<const uint4*>(w_rows[r]) + cc) : make_uint4(0, 0, 0, 0);
      }
  };
  const auto consume = [&](const uint4(&src)[R][U], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * workers;
      if (cc < chunks) {
        float4 lo = __ldg(x4 + 2 * cc), hi = __ldg(x4 + 2 * cc + 1);
        if constexpr (kBf16X) lo = round_bf16(lo), hi = round_bf16(hi);
#pragma unroll
        for (int r = 0; r < R; ++r) sums[r] += dot8(src[r][u], lo, hi);
      }
    }
  };
  load(a, first);
  load(b, first + batch);
  grid_wait();
  for (int c = first; c < chunks; c += 2 * batch) {
    consume(a, c);
    if (c + 2 * batch < chunks) load(a, c + 2 * batch);
    consume(b, c + batch);
    if (c + 3 * batch < chunks) load(b, c + 3 * batch);
  }
}

// One warp's dot products of R rows with x; every lane gets the sums.
template <int R>
__device__ __forceinline__ void rows_dot(const Bf16Bits* const (&w_rows)[R], const float* __restrict__ x, int k,
                                         int lane, float (&sums)[R]) {
  rows_dot_part<R, kRowLoads / R>(w_rows, x, k, lane, kWarp, sums);
#pragma unroll
  for (int r = 0; r < R; ++r) sums[r] = warp_sum(sums[r]);
}

__device__ __forceinline__ float row_dot(const Bf16Bits* w_row, const float* __restrict__ x, int k, int lane) {
  const Bf16Bits* rows[1] = {w_row};
  float sums[1];
  rows_dot<1>(rows, x, k, lane, sums);
  return sums[0];
}

// Launches with programmatic stream serialization (see grid_wait).
template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

inline unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

}  // namespace kettle::cuda
