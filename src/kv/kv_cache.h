// KvCache: one sequence's keys and values — a block table per kind into the
// model's KvPool (kv/kv_pool.h). It holds one reference on each of its
// blocks; a block lent by the prefix cache is shared, never written again
// (sequences only append, and lent prefixes end on a block boundary).
// Sliding-window layers keep only the blocks a later query can still see.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kv/kv_pool.h"

namespace kettle {

class KvCache {
 public:
  explicit KvCache(KvPool& pool) : pool_(&pool) {}
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() { clear(); }

  KvPool& pool() const { return *pool_; }
  int64_t length() const { return length_; }
  // Sets the positions held; sliding-window blocks no later query can see go back to the pool.
  void set_length(int64_t length);

  // Blocks for positions [0, tokens) (of a window kind: those a query at or after length()
  // can see). Throws kettle::Error (kResourceExhausted) when the pool has none left.
  void reserve(int64_t tokens);

  // Block ids of `kind` in position order; 0 where none is held.
  const std::vector<int32_t>& table(int kind) const { return tables_[static_cast<size_t>(kind)]; }

  // Starts the cache as the prefix `blocks` (per kind, in position order, 0 for a
  // released window block) of `tokens` positions, taking a reference on each.
  void adopt(const std::array<std::vector<int32_t>, KvPool::kKinds>& blocks, int64_t tokens);

  // Keeps positions [0, length) and gives back the blocks wholly past them (rejected
  // speculative tokens). Positions a query may still see must not have been let go:
  // set_rollback_margin before the step that may be rolled back.
  void truncate(int64_t length);
  // Sliding-window blocks are let go only once no query at or after length() - margin
  // can see them, so a step of up to `margin` speculative tokens can be undone.
  void set_rollback_margin(int64_t margin) { margin_ = margin; }

  // Gives every block back; the cache is empty.
  void clear();

 private:
  KvPool* pool_;
  int64_t length_ = 0;
  int64_t window_released_ = 0;  // window-kind entries below this are let go
  int64_t margin_ = 0;
  std::array<std::vector<int32_t>, KvPool::kKinds> tables_;
};

}  // namespace kettle
