// KvQuant: the KV cache's storage policy, `--kv-quant off|8|4|fp8|turbo[:kXvY]|config`,
// and the codec it gives each layer (tensor/kv_codec.h):
//   8 / 4: affine codes per group of 64 along the head dim (f16 scale and bias), keys
//     and values alike;
//   fp8: e4m3 codes per group of 64 with an f32 scale;
//   turbo[:kXvY] (k8v3 unless given; X 4 or 8, Y 2, 3 or 4): keys affine of X bits per
//     group of 32; values rotated per head and coded by Y-bit Lloyd-Max centroids per
//     group of 32 — on full-attention layers; sliding-window layers keep the plain type;
//   config: per layer {layer_idx, bits (4 or 8), group_size} from the model's
//     kv_config.json (model/kv_config.h); a layer it does not name stays plain.
// The plain type is the backend's (Backend::kv_dtype). A policy is the pool's: every
// block of one pool, cached prefixes included, is stored by it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_layout.h"

namespace kettle {

struct KvQuant {
  enum class Mode { kOff, kAffine8, kAffine4, kFp8, kTurbo, kConfig };
  struct LayerBits {
    int64_t layer = 0;
    int bits = 8;
    int group_size = 64;
  };
  Mode mode = Mode::kOff;
  int key_bits = 8, value_bits = 3;  // kTurbo
  std::vector<LayerBits> layers;     // kConfig

  bool off() const { return mode == Mode::kOff; }
  // The spelling the flag takes ("off", "8", "4", "fp8", "turbo:k8v3", "config").
  std::string name() const;
  // Layer i's codec, for a layer of `kind` whose heads are head_dim wide, `plain` the
  // backend's own element type. Throws kettle::Error (kInvalidArgument) naming --kv-quant
  // when the layer's heads cannot take the codec.
  KvCodec codec_for(int64_t layer, KvLayer::Kind kind, int64_t head_dim, DType plain) const;
};

// "--kv-quant VALUE" as given; throws kettle::Error (kInvalidArgument) naming the flag and
// the value. `config` comes back without its layers (model/kv_config.h reads them).
KvQuant parse_kv_quant(std::string_view value);

// The affine codec of `bits` per `group` elements; the plain codec of `element`.
KvRowCodec kv_affine_codec(int bits, int group);
KvRowCodec kv_plain_codec(DType element);
// "f16", "affine8/64", "fp8/64", "lloyd-max3/32 rotated": for messages and /stats.
std::string kv_codec_name(const KvRowCodec& codec);

}  // namespace kettle
