// Quantized KV rows (tensor/kv_codec.h) on the device: the store's encoding of one
// head (its groups in parallel, the same code as the CPU's, so the same bits), and
// the attention kernels' read of 8 consecutive elements into 8 f16 of shared memory
// (a group's parameters read once: groups are multiples of 8 and never straddle a
// piece). Every codec both kernels may meet — affine 2–8 bits, fp8, Lloyd-Max.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "tensor/kv_codec.h"

namespace kettle::cuda {

// Head h (head_dim elements in shared memory, rotated first when the codec says) into
// `row` of `width` elements, by the block's threads; ends with __syncthreads().
__device__ __forceinline__ void encode_head(const KvRowCodec& c, float* head, int h, int head_dim, int64_t width,
                                            uint8_t* row) {
  if (c.rotation > 0) {
    if (threadIdx.x == 0) kv_rotate(head, head_dim, c.rotation);
    __syncthreads();
  }
  const int groups = head_dim / c.group;
  uint8_t* params = row + c.code_bytes(width);
  for (int g = threadIdx.x; g < groups; g += blockDim.x)
    kv_encode_group(c, head + g * c.group, static_cast<int64_t>(h) * groups + g, row, params);
  __syncthreads();
}

// n ≤ 4 bytes from p as a little-endian word (rows are only 2-byte aligned in general).
__device__ __forceinline__ uint32_t load_bytes(const uint8_t* p, int n) {
  uint32_t w = 0;
  for (int i = 0; i < n; ++i) w |= static_cast<uint32_t>(p[i]) << (8 * i);
  return w;
}

// Elements [first, first + 8) of a quantized row of `width` elements as 8 f16 at dst
// (16-byte aligned).
__device__ __forceinline__ void decode_piece8(const KvRowCodec& c, const uint8_t* row, int64_t width, int64_t first,
                                              __half* dst) {
  float v[8];
  const uint8_t* p = row + c.code_bytes(width) + first / c.group * static_cast<int64_t>(c.group_param_bytes());
  const uint8_t* codes = row + first * c.bits / 8;
  if (c.format == KvRowCodec::Format::kFp8) {
    float s;
    memcpy(&s, p, 4);
    const uint32_t lo = load_bytes(codes, 4), hi = load_bytes(codes + 4, 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(e4m3_bits_to_f32(static_cast<uint8_t>((i < 4 ? lo : hi) >> (8 * (i % 4)))), s);
  } else {
    // 8 codes of b bits: 8b bits, at most 64.
    const int bytes = c.bits;  // 8 codes · b bits / 8
    const uint64_t word = static_cast<uint64_t>(load_bytes(codes, bytes < 4 ? bytes : 4)) |
                          (bytes > 4 ? static_cast<uint64_t>(load_bytes(codes + 4, bytes - 4)) << 32 : 0);
    const uint32_t mask = (1u << c.bits) - 1;
    uint16_t a16, b16;
    memcpy(&a16, p, 2);
    const float a = half_bits_to_f32(a16);
    float b = 0.0f;
    if (c.format == KvRowCodec::Format::kAffine) {
      memcpy(&b16, p + 2, 2);
      b = half_bits_to_f32(b16);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t q = static_cast<uint32_t>(word >> (i * c.bits)) & mask;
      v[i] = c.format == KvRowCodec::Format::kAffine ? __fadd_rn(__fmul_rn(a, static_cast<float>(q)), b)
                                                     : __fmul_rn(kv_lloyd_level(c.bits, static_cast<int>(q)), a);
    }
  }
  __half2 out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
}

// Elements [first, first + 8) of pool row `row` (row_bytes apart from base) as 8 f16 at dst:
// decoded, or copied where the layer's rows are plain f16.
__device__ __forceinline__ void read_piece8(const void* base, const KvRowCodec& c, int64_t row_bytes, int64_t width,
                                            int64_t row, int64_t first, __half* dst) {
  const uint8_t* r = static_cast<const uint8_t*>(base) + row * row_bytes;
  if (c.quantized())
    decode_piece8(c, r, width, first, dst);
  else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(r + first * 2);
}

// A warp's tile of `keys` rows (pool rows; < 0: not visible), elements [first, first + hd)
// of each, into shared-memory rows `stride` halves apart; zeros for invisible keys and for
// the dims from hd to the next multiple of 16. hd is a multiple of 8 (the codec's groups).
__device__ __forceinline__ void read_tile(const void* base, const KvRowCodec& c, int64_t row_bytes, int64_t width,
                                          const int64_t* rows, int keys, int64_t first, int hd, int stride,
                                          __half* tile, int lane) {
  const int pieces = (hd + 15) / 16 * 2;
  for (int i = lane; i < keys * pieces; i += 32) {
    const int key = i / pieces, part = i % pieces;
    __half* dst = tile + key * stride + part * 8;
    if (rows[key] >= 0 && part * 8 < hd)
      read_piece8(base, c, row_bytes, width, rows[key], first + part * 8, dst);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace kettle::cuda
