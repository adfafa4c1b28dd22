// `kettle convert SRC DST -q`: a float checkpoint → MLX's affine layout, the
// files mlx-lm itself writes and loads (tensor names, packing, config keys).
// Every projection and the embedding whose input width is a multiple of the
// group size becomes `.weight` (U32 codes), `.scales` and `.biases` (in the
// tensor's own float type); everything else is copied. Streamed tensor by tensor
// (source pages are let go as they are used), so memory stays near one tensor's
// scales; written into a temporary folder beside DST and renamed at the end, so
// a failure leaves nothing at DST.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tensor/affine_quant.h"

namespace kettle {

struct QuantizeOptions {
  int bits = 4;
  int group_size = 64;
  AffineFit fit = AffineFit::kLeastSquares;  // kMlx: mlx-lm's own codes, bit for bit
  size_t max_shard_bytes = size_t{5} << 30;  // as mlx-lm shards
  int threads = 0;                            // rows quantized in parallel; 0: every core
};

struct QuantizeReport {
  int64_t tensors = 0;    // written
  int64_t quantized = 0;  // of them, weights made into codes
  size_t bytes_in = 0;
  size_t bytes_out = 0;
  int shards = 0;
};

// progress(done, total) in source bytes, called as tensors are written.
QuantizeReport quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& options,
                                   const std::function<void(size_t, size_t)>& progress = {});

}  // namespace kettle
