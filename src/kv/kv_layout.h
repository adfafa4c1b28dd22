// KvLayout: what the KV store holds, told by the model and nothing else of it —
// per layer whether it caches keys and values for every position (full
// attention), for the last W positions (a sliding window of W) or not at all;
// the width of one cached row (KV heads × head dim, a rank's share under tensor
// parallelism); and the codec of its elements. Today's codecs are plain f32
// (the CPU) and f16 (CUDA); a quantized codec will add its group size and the
// bytes of its scales here, and the pool sizes its blocks from this alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace kettle {

struct KvCodec {
  DType element = DType::kF32;
  // Bytes of one cached row (keys or values of one token in one layer) of `width` elements.
  size_t row_bytes(int64_t width) const { return static_cast<size_t>(width) * dtype_size(element); }
  bool operator==(const KvCodec&) const = default;
};

struct KvLayer {
  enum class Kind { kFull, kWindow, kNone };
  Kind kind = Kind::kFull;
  int64_t window = 0;  // kWindow: the positions a query sees
};

struct KvLayout {
  std::vector<KvLayer> layers;
  int64_t kv_heads = 0, head_dim = 0;  // one rank's share under tensor parallelism
  KvCodec codec;

  int64_t row_width() const { return kv_heads * head_dim; }
  size_t row_bytes() const { return codec.row_bytes(row_width()); }
};

}  // namespace kettle
