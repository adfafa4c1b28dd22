// KvLayout: what the KV store holds, told by the model and the KV policy and
// nothing else — per layer whether it caches keys and values for every position
// (full attention), for the last W positions (a sliding window of W) or not at
// all, and how its rows are stored (KvCodec, tensor/kv_codec.h: the backend's
// plain type, or quantized codes with their scales); the width of one cached row
// (KV heads × head dim, a rank's share under tensor parallelism). The pool sizes
// its blocks from this alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/kv_codec.h"

namespace kettle {

struct KvLayer {
  enum class Kind { kFull, kWindow, kNone };
  Kind kind = Kind::kFull;
  int64_t window = 0;  // kWindow: the positions a query sees
  KvCodec codec;
};

struct KvLayout {
  std::vector<KvLayer> layers;
  int64_t kv_heads = 0, head_dim = 0;  // one rank's share under tensor parallelism

  int64_t row_width() const { return kv_heads * head_dim; }
  // Bytes of one cached row of layer i's keys, its values, and both.
  size_t key_row_bytes(size_t i) const { return layers[i].codec.key.row_bytes(row_width()); }
  size_t value_row_bytes(size_t i) const { return layers[i].codec.value.row_bytes(row_width()); }
  size_t token_bytes(size_t i) const {
    return layers[i].kind == KvLayer::Kind::kNone ? 0 : key_row_bytes(i) + value_row_bytes(i);
  }
};

}  // namespace kettle
