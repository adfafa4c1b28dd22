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

constexpr int kRowUnroll = 8;  // 16-byte weight loads each lane keeps in flight

// One warp's dot product of a bf16 weight row (k elements) with f32 x; every lane gets
// the sum. Rows whose k is a multiple of 8 (16-byte aligned) take the vector path.
__device__ __forceinline__ float row_dot(const Bf16Bits* w_row, const float* __restrict__ x, int k, int lane) {
  float acc = 0.0f;
  if ((k & 7) == 0) {
    const uint4* w = reinterpret_cast<const uint4*>(w_row);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int chunks = k / 8;
    int c = lane;
    for (; c + kWarp * (kRowUnroll - 1) < chunks; c += kWarp * kRowUnroll) {
      uint4 wv[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) wv[u] = load_stream(w + c + u * kWarp);
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int cc = c + u * kWarp;
        acc += dot8(wv[u], __ldg(x4 + 2 * cc), __ldg(x4 + 2 * cc + 1));
      }
    }
    for (; c < chunks; c += kWarp) acc += dot8(load_stream(w + c), __ldg(x4 + 2 * c), __ldg(x4 + 2 * c + 1));
  } else {
    for (int i = lane; i < k; i += kWarp) acc = fmaf(__uint_as_float(static_cast<uint32_t>(w_row[i]) << 16), x[i], acc);
  }
  return warp_sum(acc);
}

inline unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

}  // namespace kettle::cuda
