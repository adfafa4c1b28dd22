// Tensor-core building blocks the attention kernels share: f16 tiles in shared
// memory (rows padded so ldmatrix reads are free of bank conflicts), 16-byte
// asynchronous copies into them, ldmatrix fragment loads, and the m16n8k16
// f16 MMA with f32 accumulators (mma.sync, sm_80 and later).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kettle::cuda {

// Halves per shared-memory row of a tile of head_dim hd: hd rounded up to the MMA's 16,
// plus 8, so rows start 16-byte aligned and the 8 rows of one ldmatrix 8x8 matrix fall
// in 8 different bank groups.
__host__ __device__ constexpr int padded_row(int hd) {
  return (hd + 15) / 16 * 16 + 8;
}

__device__ __forceinline__ void copy16_async(void* smem, const void* global) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
}

// `bytes` (4, 8 or 16; both addresses aligned to it) copied asynchronously.
__device__ __forceinline__ void copy_async(void* smem, const void* global, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global));
  else if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(global));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(global));
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void copies_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void copies_done() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Four 8x8 f16 matrices from shared memory, lanes 8i..8i+7 giving matrix i's row
// addresses; kTransposed (.trans) hands each lane a column pair instead of a row pair.
template <bool kTransposed = false>
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const __half* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// c[16x8] += a[16x16] · b[16x8], f16 inputs, f32 accumulators (PTX fragment layouts:
// lane l holds c rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a packed f16 pair.
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Above 48 KB of dynamic shared memory a kernel must opt in, once per kernel (host side;
// every instantiation of a template has the same type, so callers pass the kernel itself).
void allow_shared_memory(const void* kernel, int bytes);

}  // namespace kettle::cuda
