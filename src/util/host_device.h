// KETTLE_HD marks a small inline function both the host compiler and nvcc build,
// for arithmetic the CPU and CUDA backends must do alike (the KV cache's codecs).
// KETTLE_MUL is a product that is never fused into a following add: nvcc contracts
// a * b + c into one FMA by default, the host's baseline ISA has none, so code that
// must give the same bits on both spells its products with it.
#pragma once

#if defined(__CUDACC__)
#define KETTLE_HD __host__ __device__ __forceinline__
#else
#define KETTLE_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define KETTLE_MUL(a, b) __fmul_rn((a), (b))
#else
#define KETTLE_MUL(a, b) ((a) * (b))
#endif
