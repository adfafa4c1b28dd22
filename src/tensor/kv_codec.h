// How the KV cache stores one cached row (the keys, or the values, of one token in
// one layer: KV heads × head dim elements), and the arithmetic that writes and reads
// it — one definition for the CPU and CUDA backends (util/host_device.h), so both
// store the same bits for the same row.
//
// A plain row is the backend's element type (f32 on the CPU, f16 on CUDA). A
// quantized row is its codes — a bit stream, element i at bits [i·b, i·b + b), low
// bits first (MLX's order for 4 bits) — padded to 4 bytes, then one parameter block
// per group of `group` elements (groups never straddle heads: group divides head_dim):
//   affine (4 or 8 bits): f16 scale s, f16 bias b; x ≈ s·q + b, with s = (max − min) /
//     (2^b − 1) and b = min rounded to f16 first and q = round((x − b) / s);
//   fp8: f32 scale s = amax / 448; x ≈ s · e4m3(x / s);
//   Lloyd-Max (2, 3 or 4 bits, the values of TurboQuant): f16 r = the group's RMS;
//     x ≈ r · c_q, c the Lloyd-Max centroids of a unit Gaussian. Its rows are rotated
//     first: per head, channels sign-flipped by a fixed pattern, then a Walsh–Hadamard
//     transform of each block of `rotation` channels (the largest power of two dividing
//     the head dim: the whole head for 64, 128 or 256) scaled by 1/√rotation
//     (orthonormal, its own inverse), so a head's values are near Gaussian; attention
//     sums rotated values and un-rotates its output once (kv_unrotate).
// Zero bytes decode to zeros in every codec (a fresh block reads as 0, never NaN).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/float_bits.h"
#include "tensor/hadamard.h"
#include "util/host_device.h"

namespace kettle {

constexpr int kMaxKvHeadDim = 512;  // a rotated head is transformed in a buffer of this size

struct KvRowCodec {
  enum class Format : uint8_t { kPlain, kAffine, kFp8, kLloydMax };
  Format format = Format::kPlain;
  DType element = DType::kF32;  // kPlain: the stored element type
  int bits = 0;                 // kAffine: 4 or 8; kFp8: 8; kLloydMax: 2, 3 or 4
  int group = 0;                // elements per parameter block
  int rotation = 0;             // kLloydMax: channels per Hadamard block of a head's rotation; 0: none

  KETTLE_HD bool quantized() const { return format != Format::kPlain; }
  KETTLE_HD size_t code_bytes(int64_t width) const {
    return (static_cast<size_t>(width) * static_cast<size_t>(bits) / 8 + 3) / 4 * 4;
  }
  KETTLE_HD size_t group_param_bytes() const { return format == Format::kLloydMax ? 2 : 4; }
  KETTLE_HD size_t row_bytes(int64_t width) const {
    if (!quantized()) return static_cast<size_t>(width) * dtype_size_hd(element);
    return code_bytes(width) + static_cast<size_t>(width / group) * group_param_bytes();
  }
  KETTLE_HD static size_t dtype_size_hd(DType d) { return d == DType::kF32 ? 4 : d == DType::kF8E4M3 ? 1 : 2; }
  // (Spelled out: nvcc builds this header as C++17.)
  bool operator==(const KvRowCodec& o) const {
    return format == o.format && element == o.element && bits == o.bits && group == o.group && rotation == o.rotation;
  }
  bool operator!=(const KvRowCodec& o) const { return !(*this == o); }
};

// A layer's keys and values.
struct KvCodec {
  KvRowCodec key, value;
  bool operator==(const KvCodec& o) const { return key == o.key && value == o.value; }
  bool operator!=(const KvCodec& o) const { return !(*this == o); }
};

// --- bit streams ---

KETTLE_HD uint32_t kv_code(const uint8_t* codes, int64_t bit, int bits) {
  const int64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  uint32_t word = codes[byte];
  if (shift + bits > 8) word |= static_cast<uint32_t>(codes[byte + 1]) << 8;
  return (word >> shift) & ((1u << bits) - 1);
}

KETTLE_HD void kv_put_code(uint8_t* codes, int64_t bit, int bits, uint32_t q) {
  const int64_t byte = bit >> 3;
  const int shift = static_cast<int>(bit & 7);
  const uint32_t word = q << shift;
  codes[byte] = static_cast<uint8_t>(codes[byte] | (word & 0xffu));
  if (shift + bits > 8) codes[byte + 1] = static_cast<uint8_t>(codes[byte + 1] | (word >> 8));
}

// --- Lloyd-Max centroids of a unit Gaussian (Max, 1960), ascending ---

KETTLE_HD float kv_lloyd_level(int bits, int index) {
  const int half = 1 << (bits - 1);
  const int k = index >= half ? index - half : half - 1 - index;  // distance from the middle
  float level = 0.0f;
  if (bits == 2) {
    level = k == 0 ? 0.4528f : 1.5104f;
  } else if (bits == 3) {
    level = k == 0 ? 0.24509f : k == 1 ? 0.75601f : k == 2 ? 1.34391f : 2.15195f;
  } else {
    switch (k) {
      case 0: level = 0.1284f; break;
      case 1: level = 0.3881f; break;
      case 2: level = 0.6568f; break;
      case 3: level = 0.9424f; break;
      case 4: level = 1.2562f; break;
      case 5: level = 1.6181f; break;
      case 6: level = 2.0690f; break;
      default: level = 2.7326f; break;
    }
  }
  return index >= half ? level : -level;
}

// The centroid nearest u (a tie to the lower one).
KETTLE_HD uint32_t kv_lloyd_code(int bits, float u) {
  const int levels = 1 << bits;
  uint32_t q = 0;
  for (int i = 0; i + 1 < levels; ++i)
    if (u > 0.5f * (kv_lloyd_level(bits, i) + kv_lloyd_level(bits, i + 1))) q = static_cast<uint32_t>(i + 1);
  return q;
}

// --- one group ---

// Codes and parameters of elements x[0, group) of a row's group g (`codes`: the row's code
// region). A group's codes fill whole bytes of their own (group · bits is a multiple of 8),
// so groups may be written in parallel.
KETTLE_HD void kv_encode_group(const KvRowCodec& c, const float* x, int64_t g, uint8_t* codes, uint8_t* params) {
  const int n = c.group;
  const int64_t first_bit = g * n * c.bits;
  for (int i = 0; i < n * c.bits / 8; ++i) codes[first_bit / 8 + i] = 0;
  uint8_t* p = params + g * static_cast<int64_t>(c.group_param_bytes());
  if (c.format == KvRowCodec::Format::kAffine) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; ++i) lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
    const float max_q = static_cast<float>((1 << c.bits) - 1);
    const float scale = fminf((hi - lo) / max_q, 65504.0f);
    const uint16_t s16 = f32_to_half_bits(scale), b16 = f32_to_half_bits(fmaxf(fminf(lo, 65504.0f), -65504.0f));
    memcpy(p, &s16, 2);
    memcpy(p + 2, &b16, 2);
    const float s = half_bits_to_f32(s16), b = half_bits_to_f32(b16);
    for (int i = 0; i < n; ++i) {
      const float q = s > 0.0f ? fminf(fmaxf(rintf((x[i] - b) / s), 0.0f), max_q) : 0.0f;
      kv_put_code(codes, first_bit + i * c.bits, c.bits, static_cast<uint32_t>(q));
    }
  } else if (c.format == KvRowCodec::Format::kFp8) {
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
    const float s = amax / 448.0f;
    memcpy(p, &s, 4);
    for (int i = 0; i < n; ++i) codes[first_bit / 8 + i] = s > 0.0f ? f32_to_e4m3_bits(x[i] / s) : 0;
  } else {  // Lloyd-Max
    float squares = 0.0f;
    for (int i = 0; i < n; ++i) squares += KETTLE_MUL(x[i], x[i]);
    const uint16_t r16 = f32_to_half_bits(sqrtf(squares / static_cast<float>(n)));
    memcpy(p, &r16, 2);
    const float r = half_bits_to_f32(r16);
    for (int i = 0; i < n; ++i)
      kv_put_code(codes, first_bit + i * c.bits, c.bits, kv_lloyd_code(c.bits, r > 0.0f ? x[i] / r : 0.0f));
  }
}

// Element i of a quantized row of `width` elements.
KETTLE_HD float kv_decode(const KvRowCodec& c, const uint8_t* row, int64_t width, int64_t i) {
  const int64_t g = i / c.group;
  const uint8_t* p = row + c.code_bytes(width) + g * static_cast<int64_t>(c.group_param_bytes());
  if (c.format == KvRowCodec::Format::kAffine) {
    uint16_t s16, b16;
    memcpy(&s16, p, 2);
    memcpy(&b16, p + 2, 2);
    const float q = static_cast<float>(kv_code(row, i * c.bits, c.bits));
    return KETTLE_MUL(half_bits_to_f32(s16), q) + half_bits_to_f32(b16);
  }
  if (c.format == KvRowCodec::Format::kFp8) {
    float s;
    memcpy(&s, p, 4);
    return KETTLE_MUL(e4m3_bits_to_f32(row[i]), s);
  }
  uint16_t r16;
  memcpy(&r16, p, 2);
  return KETTLE_MUL(kv_lloyd_level(c.bits, static_cast<int>(kv_code(row, i * c.bits, c.bits))), half_bits_to_f32(r16));
}

// --- 16-element pieces (the CUDA attention's vector reads) ---

// Elements [16 p, 16 p + 16) of a quantized row, as they sit in it: their codes (2 · bits
// bytes, little-endian words, low bits first) and their group's parameter block (a piece
// never straddles a group where group % 16 == 0), one little-endian word.
struct KvPiece {
  uint32_t words[4];
  uint32_t param;
};

// Whether 16-element pieces of rows of `width` elements in heads of head_dim read as
// KvPiece: groups of whole pieces, and every piece's codes and parameters aligned to their
// own size in a row that is (codes: 2 · bits bytes, 4, 6, 8 or 16; parameters: 2 or 4).
KETTLE_HD bool kv_pieces_fit(const KvRowCodec& c, int64_t width, int head_dim) {
  if (!c.quantized() || c.group % 16 != 0 || head_dim % 16 != 0) return false;
  if (c.bits != 2 && c.bits != 3 && c.bits != 4 && c.bits != 8) return false;  // the widths the device loads
  const size_t code_unit = c.bits == 3 ? 2 : static_cast<size_t>(2 * c.bits), row = c.row_bytes(width);
  return row % code_unit == 0 && row % c.group_param_bytes() == 0;
}

// Piece p of a quantized row of `width` elements (host reads; the device loads its words as
// vectors, kv_rows.cuh).
KETTLE_HD KvPiece kv_load_piece(const KvRowCodec& c, const uint8_t* row, int64_t width, int64_t p) {
  KvPiece piece{{0, 0, 0, 0}, 0};
  memcpy(piece.words, row + p * 2 * c.bits, static_cast<size_t>(2 * c.bits));
  memcpy(&piece.param, row + c.code_bytes(width) + p * 16 / c.group * static_cast<int64_t>(c.group_param_bytes()),
         c.group_param_bytes());
  return piece;
}

// A piece's 16 values, as kv_decode gives them; B = c.bits (a constant, so each code's
// word is known at compile time and the piece stays in registers on the device).
template <int B>
KETTLE_HD void kv_decode_piece_bits(const KvRowCodec& c, const KvPiece& piece, float* out) {
  uint32_t q[16];
  for (int e = 0; e < 16; ++e) {
    const int bit = e * B, word = bit >> 5, shift = bit & 31;
    uint32_t code = piece.words[word] >> shift;
    if (shift + B > 32) code |= piece.words[word + 1] << (32 - shift);
    q[e] = code & ((1u << B) - 1);
  }
  if (c.format == KvRowCodec::Format::kAffine) {
    const float s = half_bits_to_f32(static_cast<uint16_t>(piece.param)),
                b = half_bits_to_f32(static_cast<uint16_t>(piece.param >> 16));
    for (int e = 0; e < 16; ++e) out[e] = KETTLE_MUL(s, static_cast<float>(q[e])) + b;
  } else if (c.format == KvRowCodec::Format::kFp8) {
    const float s = f32_from_bits(piece.param);
    for (int e = 0; e < 16; ++e) out[e] = KETTLE_MUL(e4m3_bits_to_f32(static_cast<uint8_t>(q[e])), s);
  } else {
    const float r = half_bits_to_f32(static_cast<uint16_t>(piece.param));
    for (int e = 0; e < 16; ++e) out[e] = KETTLE_MUL(kv_lloyd_level(B, static_cast<int>(q[e])), r);
  }
}

// A piece's 16 values (c.bits is 2, 3, 4 or 8: kv_pieces_fit).
KETTLE_HD void kv_decode_piece(const KvRowCodec& c, const KvPiece& piece, float* out) {
  if (c.bits == 8)
    kv_decode_piece_bits<8>(c, piece, out);
  else if (c.bits == 4)
    kv_decode_piece_bits<4>(c, piece, out);
  else if (c.bits == 3)
    kv_decode_piece_bits<3>(c, piece, out);
  else
    kv_decode_piece_bits<2>(c, piece, out);
}

// --- rotation (Lloyd-Max rows) ---

KETTLE_HD bool kv_rotation_flips(int channel) { return ((static_cast<uint32_t>(channel) * 0x9E3779B1u) >> 31) != 0; }

// v[0, n) ← H v / √n, H the Sylvester Hadamard matrix of order n (a power of two).
KETTLE_HD void kv_hadamard(float* v, int n) {
  walsh_hadamard(v, n);
  const float scale = 1.0f / sqrtf(static_cast<float>(n));
  for (int i = 0; i < n; ++i) v[i] = KETTLE_MUL(v[i], scale);
}

// One head of n channels into the rotated basis (Hadamard blocks of `block` channels), and back.
KETTLE_HD void kv_rotate(float* v, int n, int block) {
  for (int i = 0; i < n; ++i)
    if (kv_rotation_flips(i)) v[i] = -v[i];
  for (int b = 0; b < n; b += block) kv_hadamard(v + b, block);
}
KETTLE_HD void kv_unrotate(float* v, int n, int block) {
  for (int b = 0; b < n; b += block) kv_hadamard(v + b, block);
  for (int i = 0; i < n; ++i)
    if (kv_rotation_flips(i)) v[i] = -v[i];
}

// --- whole rows (quantized codecs) ---

// Row x[0, width) of heads of head_dim elements into `row` (row_bytes(width) bytes).
KETTLE_HD void kv_encode_row(const KvRowCodec& c, const float* x, int64_t width, int head_dim, uint8_t* row) {
  const size_t code_bytes = c.code_bytes(width);
  for (size_t i = static_cast<size_t>(width) * static_cast<size_t>(c.bits) / 8; i < code_bytes; ++i) row[i] = 0;  // padding
  uint8_t* params = row + code_bytes;
  const int64_t groups_per_head = head_dim / c.group;
  float head[kMaxKvHeadDim];
  for (int64_t h = 0; h * head_dim < width; ++h) {
    const float* src = x + h * head_dim;
    if (c.rotation > 0) {
      for (int i = 0; i < head_dim; ++i) head[i] = src[i];
      kv_rotate(head, head_dim, c.rotation);
      src = head;
    }
    for (int64_t g = 0; g < groups_per_head; ++g) kv_encode_group(c, src + g * c.group, h * groups_per_head + g, row, params);
  }
}

// Elements [begin, begin + count) of a quantized row of `width` elements into out, a group's
// parameters read once (rotated rows stay rotated).
KETTLE_HD void kv_decode_span(const KvRowCodec& c, const uint8_t* row, int64_t width, int64_t begin, int64_t count,
                              float* out) {
  const uint8_t* params = row + c.code_bytes(width);
  for (int64_t i = begin, end = begin + count; i < end;) {
    const int64_t g = i / c.group, group_end = (g + 1) * c.group < end ? (g + 1) * c.group : end;
    const uint8_t* p = params + g * static_cast<int64_t>(c.group_param_bytes());
    if (c.format == KvRowCodec::Format::kAffine) {
      uint16_t s16, b16;
      memcpy(&s16, p, 2);
      memcpy(&b16, p + 2, 2);
      const float s = half_bits_to_f32(s16), b = half_bits_to_f32(b16);
      if (c.bits == 8) {  // the common widths without the bit stream's shifts (the same values)
        for (; i < group_end; ++i) out[i - begin] = KETTLE_MUL(s, static_cast<float>(row[i])) + b;
      } else if (c.bits == 4) {
        for (; i < group_end; ++i)
          out[i - begin] = KETTLE_MUL(s, static_cast<float>((row[i >> 1] >> ((i & 1) * 4)) & 0xf)) + b;
      } else {
        for (; i < group_end; ++i)
          out[i - begin] = KETTLE_MUL(s, static_cast<float>(kv_code(row, i * c.bits, c.bits))) + b;
      }
    } else if (c.format == KvRowCodec::Format::kFp8) {
      float s;
      memcpy(&s, p, 4);
      for (; i < group_end; ++i) out[i - begin] = KETTLE_MUL(e4m3_bits_to_f32(row[i]), s);
    } else {
      uint16_t r16;
      memcpy(&r16, p, 2);
      const float r = half_bits_to_f32(r16);
      for (; i < group_end; ++i)
        out[i - begin] = KETTLE_MUL(kv_lloyd_level(c.bits, static_cast<int>(kv_code(row, i * c.bits, c.bits))), r);
    }
  }
}

}  // namespace kettle
