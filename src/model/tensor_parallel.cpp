#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace kettle {
namespace {

// Rank r's share of `total` split `ranks` ways: the first ranks take the larger parts.
struct Slice {
  int64_t begin = 0, count = 0;
};
Slice slice_of(int64_t total, int rank, int ranks) {
  const int64_t base = total / ranks, extra = total % ranks;
  return Slice{rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

Tensor rows_of(const Tensor& t, Slice s) { return t.empty() ? t : t.rows(s.begin, s.count); }

// Columns [begin, begin + count) of a row-major [rows, cols] matrix, copied into `owned`.
Tensor columns_of(const Tensor& t, Slice s, std::vector<std::vector<uint8_t>>& owned) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  const size_t elem = dtype_size(t.dtype);
  std::vector<uint8_t>& bytes = owned.emplace_back(static_cast<size_t>(rows * s.count) * elem);
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(bytes.data() + static_cast<size_t>(r * s.count) * elem,
                src + static_cast<size_t>(r * cols + s.begin) * elem, static_cast<size_t>(s.count) * elem);
  return Tensor{bytes.data(), t.dtype, {rows, s.count}};
}

// Rows of several slices of `t`, one after the other, copied into `owned` (a fused qkv).
Tensor rows_concat(const Tensor& t, const std::vector<Slice>& slices, std::vector<std::vector<uint8_t>>& owned) {
  if (t.empty()) return t;
  const int64_t row_elems = t.numel() / t.dim(0);
  const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(t.dtype);
  int64_t total = 0;
  for (const Slice& s : slices) total += s.count;
  std::vector<uint8_t>& bytes = owned.emplace_back(static_cast<size_t>(total) * row_bytes);
  size_t at = 0;
  for (const Slice& s : slices) {
    std::memcpy(bytes.data() + at, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(s.begin) * row_bytes,
                static_cast<size_t>(s.count) * row_bytes);
    at += static_cast<size_t>(s.count) * row_bytes;
  }
  Tensor out{bytes.data(), t.dtype, t.shape};
  out.shape[0] = total;
  return out;
}

}  // namespace

void check_splittable(const ModelSpec& s, int ranks) {
  if (ranks < 1) fail(ErrorCategory::kInvalidArgument, "--tensor-parallel must be at least 1, got {}", ranks);
  const auto need = [&](int64_t value, const char* what) {
    if (value % ranks != 0)
      fail(ErrorCategory::kUnsupported, "--tensor-parallel {}: the model's {} ({}) does not divide by {}", ranks, what,
           value, ranks);
  };
  need(s.n_heads, "attention heads");
  need(s.n_kv_heads, "KV heads");
  need(s.intermediate_size, "intermediate size");
  if (s.vocab_size < ranks)
    fail(ErrorCategory::kUnsupported, "--tensor-parallel {}: a vocabulary of {} is too small to split", ranks,
         s.vocab_size);
  if (ranks > 1)
    for (const LayerSpec& l : s.layers)
      if (l.moe) fail(ErrorCategory::kUnsupported, "--tensor-parallel {}: mixture-of-experts layers do not split yet", ranks);
  if (ranks > 1 && s.quant.present())
    fail(ErrorCategory::kUnsupported, "--tensor-parallel {}: quantized checkpoints do not split yet", ranks);
}

ModelShard shard_model(const Model& model, int rank, int ranks) {
  const ModelSpec& s = model.spec;
  check_splittable(s, ranks);
  ModelShard shard;
  shard.rank = rank;
  shard.ranks = ranks;
  shard.full_vocab = s.vocab_size;
  shard.model.source = model.source;
  shard.model.store = model.store;
  shard.model.generation = model.generation;

  ModelSpec& spec = shard.model.spec;
  spec = s;
  spec.n_heads = s.n_heads / ranks;
  spec.n_kv_heads = s.n_kv_heads / ranks;
  spec.intermediate_size = s.intermediate_size / ranks;
  const Slice vocab = slice_of(s.vocab_size, rank, ranks);
  spec.vocab_size = vocab.count;
  shard.vocab_begin = vocab.begin;

  const Slice q{rank * spec.q_size(), spec.q_size()}, kv{rank * spec.kv_size(), spec.kv_size()};
  const Slice inter{rank * spec.intermediate_size, spec.intermediate_size};
  const Slice k_in_fused{s.q_size() + kv.begin, kv.count}, v_in_fused{s.q_size() + s.kv_size() + kv.begin, kv.count};
  const Slice up_in_fused{s.intermediate_size + inter.begin, inter.count};
  auto& owned = shard.owned;
  const ModelWeights& w = model.weights;
  ModelWeights& out = shard.model.weights;
  out.embed = w.embed;
  out.final_norm = w.final_norm;
  out.lm_head.weight = rows_of(w.lm_head.weight, vocab);
  for (const LayerWeights& l : w.layers) {
    LayerWeights r;
    r.attn_norm = l.attn_norm;
    r.ffn_norm = l.ffn_norm;
    r.attn_post_norm = l.attn_post_norm;
    r.ffn_post_norm = l.ffn_post_norm;
    r.q_norm = l.q_norm;
    r.k_norm = l.k_norm;
    // Column-parallel (by output rows): q, k, v, gate, up and their biases.
    const auto by_rows = [](const Linear& p, Slice s) { return Linear{rows_of(p.weight, s), rows_of(p.bias, s)}; };
    r.q = by_rows(l.q, q);
    r.k = by_rows(l.k, kv);
    r.v = by_rows(l.v, kv);
    r.qkv = {rows_concat(l.qkv.weight, {q, k_in_fused, v_in_fused}, owned),
             rows_concat(l.qkv.bias, {q, k_in_fused, v_in_fused}, owned)};
    if (!l.gate_up.empty()) {
      r.gate = by_rows(l.gate_up, inter);
      r.up = by_rows(l.gate_up, up_in_fused);
    } else {
      r.gate = by_rows(l.gate, inter);
      r.up = by_rows(l.up, inter);
    }
    // Row-parallel (by input columns): o and down; their partial sums meet in the
    // all-reduce, so the bias is added once, on rank 0.
    r.o = {columns_of(l.o.weight, q, owned), rank == 0 ? l.o.bias : Tensor{}};
    r.down = {columns_of(l.down.weight, inter, owned), rank == 0 ? l.down.bias : Tensor{}};
    out.layers.push_back(std::move(r));
  }
  return shard;
}

}  // namespace kettle
