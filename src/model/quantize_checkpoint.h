// `kettle convert SRC DST -q`: a float checkpoint → MLX's affine layout, the
// files mlx-lm itself writes and loads (tensor names, packing, config keys).
// Every projection and the embedding whose input width is a multiple of the
// group size becomes `.weight` (U32 codes), `.scales` and `.biases` (in the
// tensor's own float type); everything else is copied. Streamed tensor by tensor
// (source pages are let go as they are used), so memory stays near one tensor's
// scales; written into a temporary folder beside DST and renamed at the end, so
// a failure leaves nothing at DST. Mixed precision: per-tensor bits (chosen by
// model/quant_sensitivity.h, measured on the rotated model when rotating), written as
// mlx-lm's per-module overrides. Rotation:
// the weights a residual-stream rotation changes (model/rotate_weights.h) are read
// rotated, as f32, and written so when not quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "model/model.h"
#include "model/weight_store.h"
#include "tensor/affine_quant.h"
#include "util/thread_pool.h"

namespace kettle {

struct QuantizeOptions {
  bool quantize = true;        // false: the weights stay float (with rotate: rotated, written as f32)
  bool rotate = false;         // a random Hadamard rotation folded in first (model/rotate_weights.h)
  uint64_t rotation_seed = 0;
  int bits = 4;  // every quantized weight's, but those `tensor_bits` names
  std::map<std::string, int> tensor_bits;  // mixed precision: a weight's own bits (by tensor name)
  int group_size = 64;
  AffineFit fit = AffineFit::kLeastSquares;  // kMlx: mlx-lm's own codes, bit for bit
  size_t max_shard_bytes = size_t{5} << 30;  // as mlx-lm shards
  int threads = 0;                            // rows quantized in parallel; 0: every core
  // Mixed precision: called once the source is checked, with the float model convert will
  // quantize (rotated when `rotate`: its store then holds the rotated tensors as f32) and
  // the type each weight's scales will be written in where it is not the tensor's own
  // (rotated weights: their source's); returns tensor_bits (the most common width then
  // becomes `bits`, the default config.json names).
  std::function<std::map<std::string, int>(Model& source, const std::map<std::string, DType>& scale_types)>
      choose_bits;

  int bits_for(const std::string& tensor) const {
    auto it = tensor_bits.find(tensor);
    return it == tensor_bits.end() ? bits : it->second;
  }
};

struct QuantizeReport {
  int64_t tensors = 0;    // written
  int64_t quantized = 0;  // of them, weights made into codes
  size_t bytes_in = 0;
  size_t bytes_out = 0;
  int shards = 0;
  int bits = 0;                    // the default width (mixed precision: the most common)
  std::map<int, int64_t> weights_at_bits;  // bits → quantized weights of that width
  int64_t parameters = 0;        // elements of every source tensor
  double bits_per_weight = 0.0;  // bytes_out · 8 / parameters (codes, scales, biases and the float rest)
};

// A 2-d `.weight` whose rows split into whole groups: what mlx-lm quantizes (its Linear and
// Embedding modules; norms are 1-d).
bool quantizable(const std::string& name, const Tensor& t, int group_size);

// Bits per weight of a weight in `bits` with groups of `group_size`, its scales and biases
// stored in `scale_type`: the codes plus the two per group.
double affine_bits_per_weight(int bits, int group_size, DType scale_type);

// Rows [r0, r0 + n) of float weight `w` quantized across `pool`: n · in · bits / 32 code
// words, and n · in / group_size scales and biases each, stored as `stored`.
void quantize_weight_rows(const Tensor& w, int64_t r0, int64_t n, int bits, int group_size, AffineFit fit,
                          DType stored, uint32_t* codes, void* scales, void* biases, ThreadPool& pool);

// progress(done, total) in source bytes, called as tensors are written.
QuantizeReport quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& options,
                                   const std::function<void(size_t, size_t)>& progress = {});

}  // namespace kettle
