// Quantized KV rows (tensor/kv_codec.h) on the device: the store's encoding of one
// head (its groups in parallel, the same code as the CPU's, so the same bits), and
// the attention kernels' read of 8 consecutive elements into 8 f16 of shared memory
// (a group's parameters read once: groups are multiples of 8 and never straddle a
// piece). Every codec both kernels may meet — affine 2–8 bits, fp8, Lloyd-Max.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"
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

// --- 16-element pieces (kv_pieces_fit): vector loads, all of a thread's in flight at once ---

// Piece p of a row by loads of its own width (aligned: kv_pieces_fit).
__device__ __forceinline__ KvPiece load_piece(const KvRowCodec& c, const uint8_t* row, int64_t code_bytes, int64_t p) {
  KvPiece piece{{0, 0, 0, 0}, 0};
  const uint8_t* codes = row + p * 2 * c.bits;
  if (c.bits == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(codes);
    piece.words[0] = v.x, piece.words[1] = v.y, piece.words[2] = v.z, piece.words[3] = v.w;
  } else if (c.bits == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(codes);
    piece.words[0] = v.x, piece.words[1] = v.y;
  } else if (c.bits == 2) {
    piece.words[0] = *reinterpret_cast<const uint32_t*>(codes);
  } else {  // 3 bits: 6 bytes, 2-byte aligned
    const uint16_t* h = reinterpret_cast<const uint16_t*>(codes);
    piece.words[0] = h[0] | static_cast<uint32_t>(h[1]) << 16, piece.words[1] = h[2];
  }
  const uint8_t* param = row + code_bytes + p * 16 / c.group * static_cast<int64_t>(c.group_param_bytes());
  piece.param = c.group_param_bytes() == 4 ? *reinterpret_cast<const uint32_t*>(param)
                                           : *reinterpret_cast<const uint16_t*>(param);
  return piece;
}

// A piece's 16 values as f16 at dst (16-byte aligned); zeros where !real.
__device__ __forceinline__ void store_piece(const KvRowCodec& c, const KvPiece& piece, bool real, __half* dst) {
  uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (real) {
    float v[16];
    kv_decode_piece(c, piece, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// Pieces first + step · i (i < N) of one matrix (keys or values) of a tile whose rows are
// rows[i] (< 0: none), all N loads issued before any is used.
template <int N>
__device__ __forceinline__ void load_pieces(const void* base, const KvRowCodec& c, int64_t row_bytes, int64_t width,
                                            const int64_t (&rows)[N], int64_t head_piece, int per_row, int first,
                                            int step, KvPiece (&pieces)[N]) {
  const int64_t code_bytes = static_cast<int64_t>(c.code_bytes(width));
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (rows[i] >= 0)
      pieces[i] = load_piece(c, static_cast<const uint8_t*>(base) + rows[i] * row_bytes, code_bytes,
                             head_piece + (first + step * i) % per_row);
}

// Those pieces decoded into the f16 tile (zeros where rows[i] < 0).
template <int N>
__device__ __forceinline__ void store_pieces(const KvRowCodec& c, const int64_t (&rows)[N], const KvPiece (&pieces)[N],
                                             int total, int per_row, int first, int step, int stride, __half* tile) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int index = first + step * i;
    if (index < total)
      store_piece(c, pieces[i], rows[i] >= 0, tile + (index / per_row) * stride + (index % per_row) * 16);
  }
}

// The keys and values of a tile of `keys` rows, head elements [head_offset, head_offset + hd)
// of each, as f16 rows `stride` halves apart (kv.pieces holds): this thread takes the tile's
// pieces first + step · i (i < N; key = piece / (hd / 16)), in rounds of up to 4 whose keys'
// and values' loads are all issued before the first is decoded (more would spill registers
// beside the attention's own). row_of(key): the key's pool row, or < 0 for zeros.
template <int N, typename KvView, typename RowOf>
__device__ __forceinline__ void read_kv_pieces(const KvView& kv, RowOf row_of, int keys, int64_t head_offset, int hd,
                                               int stride, int first, int step, __half* k_tile, __half* v_tile) {
  constexpr int R = N < 4 ? N : 4;
  static_assert(N % R == 0, "whole rounds");
  const int per_row = hd / 16, total = keys * per_row;
  const int64_t head_piece = head_offset / 16;
#pragma unroll
  for (int round = 0; round < N / R; ++round) {
    const int from = first + step * R * round;
    int64_t rows[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int index = from + step * i;
      rows[i] = index < total ? row_of(index / per_row) : -1;
    }
    KvPiece k[R], v[R];
    load_pieces<R>(kv.k, kv.key_codec, kv.key_row_bytes, kv.ld, rows, head_piece, per_row, from, step, k);
    load_pieces<R>(kv.v, kv.value_codec, kv.value_row_bytes, kv.ld, rows, head_piece, per_row, from, step, v);
    store_pieces<R>(kv.key_codec, rows, k, total, per_row, from, step, stride, k_tile);
    store_pieces<R>(kv.value_codec, rows, v, total, per_row, from, step, stride, v_tile);
  }
}

// --- staged tiles: a tile's raw codes and parameters copied asynchronously into shared
// memory (the next tile's copies in flight while this one's MMAs run), decoded from there ---

// Whether a codec's rows stage with cp.async: pieces of 4, 8 or 16 bytes of codes and
// 4-byte parameter blocks (affine 2, 4 or 8 bits; fp8), on rows kv_pieces_fit.
__host__ __device__ inline bool kv_stages(const KvRowCodec& c) {
  return (c.bits == 2 || c.bits == 4 || c.bits == 8) && c.group_param_bytes() == 4;
}

// One matrix's staging of a warp's tile of 32 keys: each key's head codes, then each key's
// head parameter blocks; 16-byte aligned sizes.
struct KvStage {
  int code_bytes = 0;   // per key: head_dim · bits / 8
  int groups = 0;       // per key: head_dim / group
  __host__ __device__ KvStage(const KvRowCodec& c, int hd) : code_bytes(hd * c.bits / 8), groups(c.group > 0 ? hd / c.group : 0) {}
  __host__ __device__ int codes_size(int keys) const { return (keys * code_bytes + 15) / 16 * 16; }
  __host__ __device__ int bytes(int keys) const { return codes_size(keys) + (keys * groups * 4 + 15) / 16 * 16; }
};

// The async copies of `keys` rows' head [head_offset, + hd) (rows[key] < 0: none) into
// `stage`, by the warp's lanes; the caller commits and waits.
__device__ __forceinline__ void stage_tile(const void* base, const KvRowCodec& c, int64_t row_bytes, int64_t width,
                                           const int64_t* rows, int keys, int64_t head_offset, int hd, uint8_t* stage,
                                           int lane) {
  const KvStage s(c, hd);
  const int unit = 2 * c.bits, pieces = s.code_bytes / unit;
  const uint8_t* b = static_cast<const uint8_t*>(base);
  for (int i = lane; i < keys * pieces; i += 32) {
    const int key = i / pieces, part = i % pieces;
    if (rows[key] >= 0)
      copy_async(stage + key * s.code_bytes + part * unit, b + rows[key] * row_bytes + head_offset * c.bits / 8 + part * unit,
                 unit);
  }
  uint8_t* params = stage + s.codes_size(keys);
  const int64_t param_region = static_cast<int64_t>(c.code_bytes(width)) + head_offset / c.group * 4;
  for (int i = lane; i < keys * s.groups; i += 32) {
    const int key = i / s.groups, g = i % s.groups;
    if (rows[key] >= 0) copy_async(params + i * 4, b + rows[key] * row_bytes + param_region + g * 4, 4);
  }
}

// A staged tile decoded into f16 rows `stride` halves apart (zeros where rows[key] < 0):
// the same pieces, so the same bits, as read_kv_pieces gives.
__device__ __forceinline__ void decode_staged(const KvRowCodec& c, const uint8_t* stage, const int64_t* rows, int keys,
                                              int hd, int stride, __half* tile, int lane) {
  const KvStage s(c, hd);
  const int per_row = hd / 16, unit = 2 * c.bits;
  const uint8_t* params = stage + s.codes_size(keys);
  for (int i = lane; i < keys * per_row; i += 32) {
    const int key = i / per_row, part = i % per_row;
    const bool real = rows[key] >= 0;
    KvPiece piece{{0, 0, 0, 0}, 0};
    if (real) {
      const uint8_t* codes = stage + key * s.code_bytes + part * unit;
      if (unit == 16) {
        const uint4 v = *reinterpret_cast<const uint4*>(codes);
        piece.words[0] = v.x, piece.words[1] = v.y, piece.words[2] = v.z, piece.words[3] = v.w;
      } else if (unit == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(codes);
        piece.words[0] = v.x, piece.words[1] = v.y;
      } else {
        piece.words[0] = *reinterpret_cast<const uint32_t*>(codes);
      }
      piece.param = *reinterpret_cast<const uint32_t*>(params + (key * s.groups + part * 16 / c.group) * 4);
    }
    store_piece(c, piece, real, tile + key * stride + part * 16);
  }
}

// --- the common cases at compile time: affine rows of 8, 4 or 2 bits or fp8 rows, heads of 128, decoded
// straight into the MMA's fragments (no f16 tile: a block needs a third of the shared memory) ---
// A warp's tile of 32 keys is staged as each key's 16B bytes of codes, rows kFragmentRow apart
// (16 bytes of pad: the fragment loads below fall in distinct banks), then each key's parameter
// blocks; the codes and parameters of keys not visible are zeros, so they decode to 0. A code becomes a float by landing under 2^23's bits (0x4B000000 | q is 2^23 + q
// exactly), the parameters by the hardware's exact f16 conversion; then s · q + b as the CPU
// rounds it (__fmul_rn, __fadd_rn), and the f16 the tile would have held. fp8 codes are
// 8-bit rows with an f32 scale a group.

// Which codec the fragment reads decode: keys and values in one codec — affine of 8, 4 or 2
// bits, or fp8 — with the same groups (16, 32, 64 or 128), heads of 128; kNone otherwise.
enum class FragmentCodec { kNone, kAffine8, kAffine4, kAffine2, kFp8 };

__host__ __device__ inline FragmentCodec kv_fragment_codec(const KvRowCodec& key, const KvRowCodec& value, int hd) {
  const bool group_ok = key.group == 16 || key.group == 32 || key.group == 64 || key.group == 128;
  const bool same = key.format == value.format && key.bits == value.bits && key.group == value.group &&
                    key.rotation == 0 && value.rotation == 0;
  if (hd != 128 || !same || !group_ok || key.group_param_bytes() != 4) return FragmentCodec::kNone;
  if (key.format == KvRowCodec::Format::kFp8) return FragmentCodec::kFp8;
  if (key.format != KvRowCodec::Format::kAffine) return FragmentCodec::kNone;
  return key.bits == 8 ? FragmentCodec::kAffine8 : key.bits == 4 ? FragmentCodec::kAffine4
                                                   : key.bits == 2 ? FragmentCodec::kAffine2 : FragmentCodec::kNone;
}

__host__ __device__ constexpr int kv_fragment_row(int bits) {
  return 16 * bits + 16;
}

// Bytes of one matrix's staged tile of 32 keys (codes, then parameters; 16-byte aligned).
__host__ __device__ constexpr int kv_fragment_stage_bytes(int bits, int group) {
  return 32 * kv_fragment_row(bits) + 32 * (128 / group) * 4;
}

// The async copies of a 32-key tile's head [head_offset, + 128) (rows[key] < 0: zeros) into
// `stage`, by the warp's lanes: lane l takes piece l % 8 (2B bytes) of keys
// l / 8 + 4 i. The caller commits.
template <int B>
__device__ __forceinline__ void stage_fragment_tile(const void* base, const KvRowCodec& c, int64_t row_bytes,
                                                    int64_t width, const int64_t* rows, int64_t head_offset,
                                                    uint8_t* stage, int lane) {
  constexpr int kRow = kv_fragment_row(B), kUnit = 2 * B, kKeys = 32;
  const uint8_t* b = static_cast<const uint8_t*>(base) + head_offset * B / 8 + (lane % 8) * kUnit;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int key = lane / 8 + 4 * i;
    uint8_t* dst = stage + key * kRow + (lane % 8) * kUnit;
    if (rows[key] >= 0) {
      copy_async(dst, b + rows[key] * row_bytes, kUnit);
    } else if constexpr (kUnit == 16) {  // zeros (an fp8 NaN times a zero weight would still be NaN)
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else if constexpr (kUnit == 8) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(0, 0);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = 0;
    }
  }
  const int groups = 128 / c.group;
  uint8_t* params = stage + kKeys * kRow;
  const int64_t param_region = static_cast<int64_t>(c.code_bytes(width)) + head_offset / c.group * 4;
  for (int i = lane; i < kKeys * groups; i += 32) {
    const int key = i / groups, g = i % groups;
    if (rows[key] >= 0)
      copy_async(params + i * 4, static_cast<const uint8_t*>(base) + rows[key] * row_bytes + param_region + g * 4, 4);
    else
      *reinterpret_cast<uint32_t*>(params + i * 4) = 0;
  }
}

// 16 codes of B bits (2B bytes of a staged row, aligned to their size) as B / 2 words.
template <int B>
__device__ __forceinline__ void load_code_words(const uint8_t* at, uint32_t (&w)[B / 2]) {
  if constexpr (B == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(at);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (B == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(at);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(at);
  }
}

// A staged key's parameter block g: affine's f16 scale and bias, or fp8's f32 scale.
template <bool kFp8>
__device__ __forceinline__ void load_code_params(const uint8_t* params, int groups, int key, int g, float& scale,
                                                 float& bias) {
  const uint32_t param = *reinterpret_cast<const uint32_t*>(params + (key * groups + g) * 4);
  if constexpr (kFp8) {
    scale = __uint_as_float(param), bias = 0.0f;
  } else {
    scale = __half2float(__ushort_as_half(static_cast<unsigned short>(param)));
    bias = __half2float(__ushort_as_half(static_cast<unsigned short>(param >> 16)));
  }
}

// Code i (< 16) of those words, decoded: fp8 by the hardware's exact e4m3 → f16, times the
// scale; affine as s · q + b.
template <int B, bool kFp8>
__device__ __forceinline__ float code_value(const uint32_t (&w)[B / 2], int i, float scale, float bias) {
  if constexpr (kFp8) {
    const auto code = static_cast<__nv_fp8_storage_t>(w[i / 4] >> (8 * (i % 4)));
    return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))), scale);
  } else {
    constexpr uint32_t kMask = (1u << B) - 1;
    const int bit = i * B;
    // 8 bits: the code's byte permuted under 0x4B's (one instruction); else shifted and masked.
    const uint32_t f = B == 8 ? __byte_perm(w[bit / 32], 0x4B000000u, 0x7540u + (bit % 32) / 8)
                              : 0x4B000000u | ((w[bit / 32] >> (bit % 32)) & kMask);
    return __fadd_rn(__fmul_rn(scale, __uint_as_float(f) - 8388608.0f), bias);
  }
}

}  // namespace kettle::cuda
