#include "kv/kv_quant.h"

#include <charconv>

#include "util/error.h"

namespace kettle {
namespace {

constexpr int kAffineGroup = 64, kTurboGroup = 32, kSmallestGroup = 8;

// Groups never straddle heads: the widest group up to `wanted` that divides head_dim
// (64 for heads of 64, 128 or 256; 32 for 96; 16 for 80).
int group_for(const KvQuant& q, int64_t layer, int64_t head_dim, int wanted) {
  for (int group = wanted; group >= kSmallestGroup; group /= 2)
    if (head_dim % group == 0) return group;
  fail(ErrorCategory::kInvalidArgument, "--kv-quant {}: layer {}'s heads are {} wide, which no group of {} to {} divides",
       q.name(), layer, head_dim, kSmallestGroup, wanted);
}

// The largest power of two dividing head_dim (the whole head when it is one), up to kMaxKvHeadDim.
int rotation_block(int64_t head_dim) {
  int block = 1;
  while (head_dim % (2 * block) == 0 && 2 * block <= kMaxKvHeadDim) block *= 2;
  return block;
}

}  // namespace

KvRowCodec kv_plain_codec(DType element) {
  KvRowCodec c;
  c.element = element;
  return c;
}

KvRowCodec kv_affine_codec(int bits, int group) {
  KvRowCodec c;
  c.format = KvRowCodec::Format::kAffine;
  c.bits = bits;
  c.group = group;
  return c;
}

std::string kv_codec_name(const KvRowCodec& c) {
  switch (c.format) {
    case KvRowCodec::Format::kPlain: return std::string(dtype_name(c.element));
    case KvRowCodec::Format::kAffine: return "affine" + std::to_string(c.bits) + "/" + std::to_string(c.group);
    case KvRowCodec::Format::kFp8: return "fp8/" + std::to_string(c.group);
    case KvRowCodec::Format::kLloydMax:
      return "lloyd-max" + std::to_string(c.bits) + "/" + std::to_string(c.group) +
             (c.rotation > 0 ? " rotated/" + std::to_string(c.rotation) : "");
  }
  return "?";
}

std::string KvQuant::name() const {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kAffine8: return "8";
    case Mode::kAffine4: return "4";
    case Mode::kFp8: return "fp8";
    case Mode::kTurbo: return "turbo:k" + std::to_string(key_bits) + "v" + std::to_string(value_bits);
    case Mode::kConfig: return "config";
  }
  return "?";
}

KvCodec KvQuant::codec_for(int64_t layer, KvLayer::Kind kind, int64_t head_dim, DType plain) const {
  const KvRowCodec base = kv_plain_codec(plain);
  switch (mode) {
    case Mode::kOff: return {base, base};
    case Mode::kAffine8:
    case Mode::kAffine4: {
      const KvRowCodec c = kv_affine_codec(mode == Mode::kAffine8 ? 8 : 4, group_for(*this, layer, head_dim, kAffineGroup));
      return {c, c};
    }
    case Mode::kFp8: {
      KvRowCodec c;
      c.format = KvRowCodec::Format::kFp8;
      c.bits = 8;
      c.group = group_for(*this, layer, head_dim, kAffineGroup);
      return {c, c};
    }
    case Mode::kTurbo: {
      if (kind != KvLayer::Kind::kFull) return {base, base};
      if (head_dim > kMaxKvHeadDim)
        fail(ErrorCategory::kInvalidArgument, "--kv-quant {}: layer {}'s heads are {} wide; turbo takes heads up to {}",
             name(), layer, head_dim, kMaxKvHeadDim);
      const int group = group_for(*this, layer, head_dim, kTurboGroup);
      KvRowCodec v;
      v.format = KvRowCodec::Format::kLloydMax;
      v.bits = value_bits;
      v.group = group;
      v.rotation = rotation_block(head_dim);
      return {kv_affine_codec(key_bits, group), v};
    }
    case Mode::kConfig:
      for (const LayerBits& l : layers) {
        if (l.layer != layer) continue;
        if (head_dim % l.group_size != 0)
          fail(ErrorCategory::kInvalidArgument,
               "--kv-quant config: layer {}'s heads are {} wide, which its group_size {} does not divide", layer,
               head_dim, l.group_size);
        const KvRowCodec c = kv_affine_codec(l.bits, l.group_size);
        return {c, c};
      }
      return {base, base};
  }
  return {base, base};
}

KvQuant parse_kv_quant(std::string_view value) {
  KvQuant q;
  if (value == "off") return q;
  if (value == "8") q.mode = KvQuant::Mode::kAffine8;
  else if (value == "4") q.mode = KvQuant::Mode::kAffine4;
  else if (value == "fp8") q.mode = KvQuant::Mode::kFp8;
  else if (value == "config") q.mode = KvQuant::Mode::kConfig;
  else if (value == "turbo" || value.starts_with("turbo:")) {
    q.mode = KvQuant::Mode::kTurbo;
    if (value != "turbo") {
      // turbo:kXvY
      const std::string_view spec = value.substr(6);
      int k = 0, v = 0;
      const char* end = spec.data() + spec.size();
      bool ok = spec.size() >= 4 && spec[0] == 'k';
      const char* p = spec.data() + 1;
      if (ok) {
        auto r = std::from_chars(p, end, k);
        ok = r.ec == std::errc() && r.ptr < end && *r.ptr == 'v';
        if (ok) {
          r = std::from_chars(r.ptr + 1, end, v);
          ok = r.ec == std::errc() && r.ptr == end;
        }
      }
      if (!ok || (k != 4 && k != 8) || v < 2 || v > 4)
        fail(ErrorCategory::kInvalidArgument,
             "--kv-quant {}: turbo takes :kXvY with key bits X of 4 or 8 and value bits Y of 2, 3 or 4 (as turbo:k8v3)",
             value);
      q.key_bits = k;
      q.value_bits = v;
    }
  } else {
    fail(ErrorCategory::kInvalidArgument, "--kv-quant {}: expected off, 8, 4, fp8, turbo[:kXvY] or config", value);
  }
  return q;
}

}  // namespace kettle
