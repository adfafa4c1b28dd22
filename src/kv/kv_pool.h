// KvPool: the paged KV store every sequence's cache lives in, shaped by a
// KvLayout (kv/kv_layout.h). Each caching layer's keys and values are one buffer
// of fixed-size blocks ([blocks * block_size, row width] elements of the
// layer's codec, backend memory); a sequence (KvCache) holds a table of block
// ids. Layers of one kind share block ids: kind 0 holds the full-attention
// layers, kind 1 the sliding-window layers, whose sequences keep only the blocks
// their window can still see; layers that cache nothing have no buffers. Blocks are reference-counted, so a prefix cache
// and several sequences can hold the same block (a shared prompt). Block 0 of
// each kind is never handed out: unused table entries and padding rows point
// at it.
//
// Under tensor parallelism every rank keeps its own buffers (its KV heads) in its
// own backend, and the ranks share the bookkeeping: a block id means the same
// block on every rank. `max_bytes` and the byte counts are per rank.
//
// The buffers grow (doubling, copied once) up to `max_bytes`; block ids stay
// valid, only addresses change, and `epoch()` counts the moves so a recorded
// step knows it is stale. Out of blocks, the pool asks its reclaimer (the
// prefix cache) to give some back before it fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend_array.h"
#include "kv/kv_layout.h"

namespace kettle {

class KvPool {
 public:
  static constexpr int kFull = 0, kWindow = 1, kKinds = 2;
  static constexpr int kDefaultBlockSize = 16;

  struct Options {
    int block_size = kDefaultBlockSize;  // tokens per block
    size_t max_bytes = 0;                // 0: grows without a cap
    // With a cap and both kinds, the window kind gets a fixed share: enough for this many
    // sequences' windows plus one step of `max_step` tokens each; the full kind the rest.
    // 0: the kinds share the cap as they grow.
    int max_sequences = 0;
    int64_t max_step = 0;
  };

  KvPool(const KvLayout& layout, Backend& backend, Options options);
  // One set of buffers per backend (tensor-parallel ranks, `layout` one rank's share).
  KvPool(const KvLayout& layout, const std::vector<Backend*>& backends, Options options);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int block_size() const { return block_size_; }
  size_t ranks() const { return backends_.size(); }
  static constexpr int kNoBlocks = -1;  // kind_of a layer that caches nothing
  const KvLayout& layout() const { return layout_; }
  int kind_of(int64_t layer) const { return layer_kind_[static_cast<size_t>(layer)]; }
  bool has_kind(int kind) const { return layers_of_kind_[static_cast<size_t>(kind)] > 0; }
  // The longest sliding window (kWindow layers); 0 when there are none.
  int64_t window() const { return window_; }
  int64_t kv_size() const { return layout_.row_width(); }
  const KvCodec& codec(int64_t layer) const { return layout_.layers[static_cast<size_t>(layer)].codec; }
  void* keys(int64_t layer, int rank = 0) { return k_[static_cast<size_t>(rank)][static_cast<size_t>(layer)].data(); }
  void* values(int64_t layer, int rank = 0) { return v_[static_cast<size_t>(rank)][static_cast<size_t>(layer)].data(); }
  uint64_t epoch() const { return epoch_; }

  // A block of `kind` with one reference; grows the buffers or asks the reclaimer when
  // none is free. Throws kettle::Error (kResourceExhausted) past max_bytes.
  int32_t allocate(int kind);
  void retain(int kind, int32_t block);
  void release(int kind, int32_t block);
  int32_t references(int kind, int32_t block) const { return refs_[static_cast<size_t>(kind)][static_cast<size_t>(block)]; }

  // Called when no block is free and the buffers may not grow; returns false when it
  // could free nothing.
  void set_reclaimer(std::function<bool()> reclaim) { reclaim_ = std::move(reclaim); }
  // Grows the buffers to max_bytes now (a GPU server reserves its KV memory at start).
  void preallocate();
  // Grows the buffers at once (within max_bytes) so `blocks` more of `kind` are free.
  void reserve(int kind, int64_t blocks);

  // Bytes one block of `kind` takes across its layers (keys and values), on one rank.
  size_t bytes_per_block(int kind) const;
  // One block of `kind` across every layer and rank as one byte string (for each rank,
  // for each layer of the kind: its keys' rows, then its values'), and back: what a
  // block is when it leaves the pool (the SSD tier) and returns into another block.
  std::vector<unsigned char> read_block(int kind, int32_t block);
  void write_block(int kind, int32_t block, std::span<const unsigned char> bytes);
  // Admission counts one kind (the full kind; the window kind in a model without one):
  // the bytes a sequence of `tokens` positions holds of it at most, and the pool's cap of it.
  size_t admission_bytes(int64_t tokens) const;
  size_t admission_capacity() const;
  size_t max_bytes() const { return max_bytes_; }
  size_t used_bytes() const;       // blocks held by someone
  size_t allocated_bytes() const;  // the buffers as they are now
  int64_t used_blocks(int kind) const { return used_[static_cast<size_t>(kind)]; }
  int64_t capacity_blocks(int kind) const { return capacity_[static_cast<size_t>(kind)]; }
  // Blocks the pool could still hand out (free now or by growing), without reclaiming.
  int64_t available_blocks(int kind) const;

 private:
  bool grow(int kind, int64_t blocks);
  void zero(Backend& backend, unsigned char* data, size_t bytes, size_t block_bytes);
  int64_t max_blocks(int kind) const;
  int admitted_kind() const { return has_kind(kFull) ? kFull : kWindow; }
  int64_t window_blocks_per_sequence() const;

  std::vector<Backend*> backends_;  // one per rank
  KvLayout layout_;
  int block_size_;
  size_t max_bytes_;
  int max_sequences_;
  int64_t max_step_;
  // One block of a layer's keys ([0]) and values ([1]): block_size rows of its codec.
  std::vector<size_t> block_bytes_[2];
  int64_t window_ = 0;
  std::vector<int> layer_kind_;
  std::vector<int64_t> layers_of_kind_ = std::vector<int64_t>(kKinds, 0);
  std::vector<std::vector<BackendArray<unsigned char>>> k_, v_;  // [rank][layer], bytes
  std::vector<int64_t> capacity_ = std::vector<int64_t>(kKinds, 0);  // blocks per layer buffer
  std::vector<int64_t> used_ = std::vector<int64_t>(kKinds, 0);
  std::vector<std::vector<int32_t>> refs_ = std::vector<std::vector<int32_t>>(kKinds);
  std::vector<std::vector<int32_t>> free_ = std::vector<std::vector<int32_t>>(kKinds);
  std::function<bool()> reclaim_;
  uint64_t epoch_ = 0;
};

}  // namespace kettle
