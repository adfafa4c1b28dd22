// PrefixCache: a tree of token blocks over the paged KV pool. Each node is one
// block of `block_size` prompt/output tokens and holds a reference on the KV
// blocks computed for it (one per pool kind), so any later request whose
// prompt starts with the same blocks (the next turn of a chat, a shared system
// prompt, an agent's fan-out — also while the first request is still
// running) adopts them instead of prefilling. Matching always leaves at least
// one prompt token to run (its logits start the generation). Least recently
// used leaves are evicted past the byte cap, and whenever the pool runs out of
// free blocks (the pool's reclaimer). Each scope (an API key and a request's
// cache_salt, hashed by the server) has its own tree: requests share cached
// blocks only within their scope, so `cached_tokens` tells a client nothing
// about another scope's prompts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "model/kv_cache.h"
#include "model/kv_pool.h"

namespace kettle {

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t hits = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the cache, summed
  int64_t entries = 0;        // blocks (tree nodes) held
  size_t bytes = 0;
  size_t capacity_bytes = 0;
};

class PrefixCache {
 public:
  // capacity_bytes 0: nothing is kept. The pool must outlive the cache.
  PrefixCache(KvPool& pool, size_t capacity_bytes);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Match {
    std::array<std::vector<int32_t>, KvPool::kKinds> blocks;  // per kind, in position order
    int64_t tokens = 0;  // a multiple of the block size, < prompt.size(); 0: no hit
  };
  // The longest cached block-aligned prefix of `prompt` whose blocks a continuation can
  // use (sliding-window layers: the window before it still held). Counts a lookup.
  Match match(std::span<const int32_t> prompt, uint64_t scope = 0);

  // Records the whole blocks of `tokens`, whose KV `kv` holds (tokens.size() <= kv.length()).
  void insert(std::span<const int32_t> tokens, const KvCache& kv, uint64_t scope = 0);

  // Evicts the least recently used leaf; false when there is none.
  bool evict_one();
  // Drops every node (the counters stay); returns how many there were.
  int64_t clear();

  PrefixCacheStats stats() const;

 private:
  struct Node {
    Node* parent = nullptr;                          // nullptr: a scope's root
    uint64_t scope = 0;                              // roots only
    std::vector<int32_t> tokens;                     // this block's tokens
    std::array<int32_t, KvPool::kKinds> block{};     // 0: none held
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    uint64_t used = 0;                               // LRU clock
  };
  size_t bytes_of(const Node& node) const;
  void touch(Node& node);
  void set_leaf(Node& node, bool leaf);
  bool usable_window(const std::vector<Node*>& path, size_t blocks) const;
  void drop(Node& node);  // a leaf: releases its blocks and removes it

  KvPool& pool_;
  size_t capacity_;
  std::map<uint64_t, Node> roots_;  // one tree per scope; a root without children is dropped
  std::set<std::pair<uint64_t, Node*>> leaves_;  // by last use
  uint64_t clock_ = 0;
  size_t bytes_ = 0;
  int64_t nodes_ = 0;
  int64_t lookups_ = 0, hits_ = 0, cached_tokens_ = 0;
};

}  // namespace kettle
