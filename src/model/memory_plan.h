// MemoryPlan: what a model needs on each device before it is loaded (`kettle
// fit`): the weights each tensor-parallel rank holds, the KV bytes a token
// adds, the working memory of a prefill step, and from those the longest
// context that fits. Computed from the ModelSpec alone (no weights read), with
// the same split rules as model/tensor_parallel.h: attention and MLP matrices
// and the LM head divided over the ranks, norms and the embedding table on
// every rank. Biases and per-head q/k norm vectors are left out (well under
// 0.1 % of any real model). A quantized checkpoint's matrices count at their
// packed size (config.json's bits and group sizes, per module) where the backend
// keeps them packed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kv/kv_layout.h"
#include "model/model_spec.h"

namespace kettle {

// Working memory kept beside the weights and the KV cache: library workspaces, the
// allocator's slack, a step's logits (`serve --memory-budget` keeps it out of the KV share).
constexpr size_t kWorkingAllowanceBytes = size_t{2} << 30;

struct MemoryPlan {
  int ranks = 1;
  size_t weight_bytes = 0;          // per rank, as the backend keeps them
  size_t streamed_bytes = 0;        // per rank, read once per decode step (all but the embedding table)
  size_t kv_bytes_per_token = 0;    // per rank, full-attention layers
  size_t window_kv_bytes_per_token = 0;  // per rank, sliding-window layers (held up to their window)
  int64_t window = 0;               // the longest sliding window (0: none)
  size_t working_bytes = 0;         // per rank: a prefill step's activations and library workspaces

  // KV bytes per rank of `sequences` sequences of `tokens` positions each.
  size_t kv_bytes(int64_t tokens, int64_t sequences = 1) const;
  // Bytes per rank for `sequences` sequences of `tokens` positions.
  size_t total_bytes(int64_t tokens, int64_t sequences = 1) const;
  // The longest context (positions per sequence, `sequences` at once) that fits in
  // `device_bytes` per rank; 0 when even the weights do not.
  int64_t max_context(size_t device_bytes, int64_t sequences = 1) const;
  // The longest context whose KV, `sequences` of it, fits in `kv_budget` bytes per rank.
  int64_t longest_context(size_t kv_budget, int64_t sequences = 1) const;
};

// How a backend keeps the weights: the bytes of a float matrix element (2 for bf16/f16,
// what a GPU keeps; 4 for f32 on the CPU), and which widths of quantized matrices stay
// packed (codes, scales and biases), in projections and in MoE routers and experts; the
// others are widened to that float type.
struct WeightStorage {
  static constexpr uint32_t kEveryWidth = (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 8);
  WeightStorage(size_t value_bytes, bool keeps_quantized = false)  // NOLINT: a plain width converts
      : value_bytes(value_bytes),
        packed_widths(keeps_quantized ? kEveryWidth : 0),
        expert_packed_widths(keeps_quantized ? kEveryWidth : 0) {}
  // bits: the widths kept packed in projections (experts: none).
  static WeightStorage packed(size_t value_bytes, std::initializer_list<int> bits) {
    WeightStorage s(value_bytes);
    for (int b : bits) s.packed_widths |= 1u << b;
    return s;
  }
  bool keeps(int bits, bool expert = false) const {
    return bits > 0 && bits < 32 && (((expert ? expert_packed_widths : packed_widths) >> bits) & 1u) != 0;
  }
  size_t value_bytes;
  uint32_t packed_widths;         // bit b set: b-bit matrices stay packed
  uint32_t expert_packed_widths;  // the same for routers and experts
  bool keeps_fp8 = false;         // FP8 projections stay FP8 (else widened)
};

// kv_value_bytes: the bytes of the backend's KV element (dtype_size of Backend::kv_dtype),
// every layer's rows plain.
MemoryPlan plan_memory(const ModelSpec& spec, int ranks, WeightStorage weights, size_t kv_value_bytes,
                       int64_t prefill_chunk = 2048);
// With each layer's KV rows stored as `kv` (one rank's layout, kv_layout()) says.
MemoryPlan plan_memory(const ModelSpec& spec, int ranks, WeightStorage weights, const KvLayout& kv,
                       int64_t prefill_chunk = 2048);

}  // namespace kettle
