// PrefixCache: the KV of finished sequences, kept so a later request whose
// prompt starts with the same tokens (the next turn of a chat, a shared system
// prompt, an agent's fan-out) prefills only what is new. Matching is by whole
// blocks of `block_size` tokens, always leaving at least one prompt token to
// run (its logits start the generation). Least recently used entries are
// evicted past the byte cap.
//
// The serial engine lends an entry's KvCache to one request at a time and
// takes the grown cache back when the request ends, so reuse costs no copy.
// (A block-level tree shared by concurrent sequences comes with the paged
// block pool of issue 7.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "model/kv_cache.h"

namespace kettle {

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t hits = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the cache, summed
  int64_t entries = 0;
  size_t bytes = 0;
  size_t capacity_bytes = 0;
};

class PrefixCache {
 public:
  // capacity_bytes 0: nothing is kept.
  PrefixCache(size_t capacity_bytes, int64_t block_size);

  struct Lease {
    KvCache kv;             // holds the first `cached_tokens` of the prompt (kv.length())
    int64_t cached_tokens;  // a multiple of block_size, < prompt.size()
  };
  // The entry sharing the longest block-aligned prefix with `prompt`, taken out of the cache
  // and truncated to that prefix; nullopt when none shares a whole block.
  std::optional<Lease> take(const std::vector<int32_t>& prompt);

  // Keeps `kv`, whose rows hold the KV of `tokens` (tokens.size() == kv.length()). Entries
  // whose tokens are a prefix of these are dropped (this one covers them).
  void put(std::vector<int32_t> tokens, KvCache kv);

  // Drops every entry (the counters stay); returns how many there were.
  int64_t clear();

  PrefixCacheStats stats() const;
  int64_t block_size() const { return block_size_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    KvCache kv;
  };
  static size_t bytes_of(const KvCache& kv);
  void evict_to(size_t capacity);

  size_t capacity_;
  int64_t block_size_;
  std::list<Entry> entries_;  // most recently used first
  size_t bytes_ = 0;
  int64_t lookups_ = 0, hits_ = 0, cached_tokens_ = 0;
};

}  // namespace kettle
