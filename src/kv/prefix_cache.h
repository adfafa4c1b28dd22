// PrefixCache: a tree of token blocks over the paged KV pool. Each node is one
// block of `block_size` prompt/output tokens and holds a reference on the KV
// blocks computed for it (one per pool kind), so any later request whose
// prompt starts with the same blocks (the next turn of a chat, a shared system
// prompt, an agent's fan-out — also while the first request is still
// running) adopts them instead of prefilling. Matching always leaves at least
// one prompt token to run (its logits start the generation).
//
// A running sequence holds the path it shares with the tree (a Hold: what it
// adopted, then what it inserted of its own), as SGLang's radix cache locks
// its paths: a held node is never evicted (evicting it would free nothing the
// sequence does not still hold) and is not charged to the byte cap, which
// counts only the blocks the cache alone keeps. Least recently used unheld
// leaves are evicted past the cap, and whenever the pool runs out of free
// blocks (the pool's reclaimer). The cache is single-threaded: its owner (the
// engine thread) makes every call, the reclaimer's included. Each scope (an API key and a request's
// cache_salt, hashed by the server) has its own tree: requests share cached
// blocks only within their scope, so `cached_tokens` tells a client nothing
// about another scope's prompts.
//
// With a disk tier (SsdTier, --ssd-cache) each node is named by its prefix's
// digest; a block that leaves memory (evicted, or demoted when unused for a
// while) is handed to the tier unless it is on disk already, the engine writes
// blocks behind while idle, and blocks read back from disk are put in the tree
// (restore) so the next match adopts them.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_pool.h"
#include "kv/ssd_tier.h"

namespace kettle {

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t hits = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the cache, summed
  int64_t entries = 0;        // blocks (tree nodes) held
  size_t bytes = 0;           // all of them
  size_t held_bytes = 0;      // of nodes a running sequence holds too (not charged to the cap)
  size_t capacity_bytes = 0;
};

class PrefixCache {
  struct Node;

 public:
  // A running sequence's hold on its path in the tree; released when it ends (or is
  // destroyed). Every hold ends before its cache does.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }
    void release();
    bool holds() const { return node_ != nullptr; }

   private:
    friend class PrefixCache;
    PrefixCache* cache_ = nullptr;
    Node* node_ = nullptr;  // the deepest node held; its ancestors are held with it
  };

  // capacity_bytes 0: nothing is kept. The pool must outlive the cache.
  PrefixCache(KvPool& pool, size_t capacity_bytes);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Match {
    std::array<std::vector<int32_t>, KvPool::kKinds> blocks;  // per kind, in position order
    int64_t tokens = 0;  // a multiple of the block size, < prompt.size(); 0: no hit
    Hold hold;           // on the matched path, for the sequence that adopts it
  };
  // The longest cached block-aligned prefix of `prompt` whose blocks a continuation can
  // use (sliding-window layers: the window before it still held). Counts a lookup.
  Match match(std::span<const int32_t> prompt, uint64_t scope = 0);

  // Records the whole blocks of `tokens`, whose KV `kv` holds (tokens.size() <= kv.length()),
  // and moves `hold` (the sequence's that owns kv) to the deepest of them.
  void insert(std::span<const int32_t> tokens, const KvCache& kv, uint64_t scope, Hold& hold);
  // As insert, for a sequence that has ended: nobody holds the path afterwards.
  void insert(std::span<const int32_t> tokens, const KvCache& kv, uint64_t scope = 0);

  // The disk tier blocks leave for (may be null: none); it outlives the cache.
  void set_disk_tier(SsdTier* tier) { tier_ = tier; }
  // The digests of the whole blocks of `prompt` a match could adopt, in order.
  std::vector<Sha256Digest> digests(std::span<const int32_t> prompt, uint64_t scope) const;
  // How many blocks of `prompt` the tree holds now (no lookup counted, nothing touched).
  size_t blocks_in_memory(std::span<const int32_t> prompt, uint64_t scope) const;
  // Blocks read back from disk for `prompt` (entries[i] is block first + i): put in the
  // tree where it lacks them, while the path leading to them is there.
  void restore(std::span<const int32_t> prompt, uint64_t scope, size_t first, const std::vector<SsdEntry>& entries);
  // Hands the tier every block it has not got yet (parents first), as many as it takes;
  // returns how many it took. `again`: also those handed before whose write failed.
  int64_t write_behind(bool again = false);
  // Hands the tier the blocks of `hold`'s path it has not got yet (a generation's checkpoint).
  void write_path(const Hold& hold);
  // Blocks the tree holds that are not on disk.
  int64_t not_on_disk() const;
  // Evicts the unheld leaves unused for `seconds` (and the parents that become such
  // leaves); returns how many.
  int64_t demote_idle(double seconds);

  // Evicts the least recently used leaf nobody holds; false when there is none.
  bool evict_one();
  // Drops every node nobody holds (the counters stay); returns how many it dropped.
  int64_t clear();

  PrefixCacheStats stats() const;

 private:
  struct Node {
    Node* parent = nullptr;                          // nullptr: a scope's root
    int64_t holds = 0;                               // holds on this node or a descendant
    bool listed = false;                             // in leaves_ (an unheld leaf)
    uint64_t scope = 0;                              // roots only
    std::vector<int32_t> tokens;                     // this block's tokens
    std::array<int32_t, KvPool::kKinds> block{};     // 0: none held
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    uint64_t used = 0;                               // LRU clock
    std::chrono::steady_clock::time_point used_at;   // when, for demotion
    Sha256Digest digest{};                           // of the prefix it ends (roots: the scope's)
    bool handed_to_disk = false;                     // given to the tier (written, or failed)
  };
  size_t bytes_of(const Node& node) const;
  void touch(Node& node);
  void relist(Node& node);  // puts node in leaves_ exactly when it is an unheld leaf
  void lock(Node* node);
  void unlock(Node* node);
  void hold_path(Hold& hold, Node* deepest);
  void trim();  // evicts past the cap
  void drop_all(Node& node);
  bool usable_window(const std::vector<Node*>& path, size_t blocks) const;
  void drop(Node& node);  // a leaf: releases its blocks (to disk first, with a tier) and removes it
  Node& root(uint64_t scope);
  Node* add_child(Node& parent, std::vector<int32_t> key);
  bool hand_to_disk(Node& node);
  template <typename Visit>
  void visit_breadth_first(Visit visit) const;

  KvPool& pool_;
  size_t capacity_;
  SsdTier* tier_ = nullptr;
  std::map<uint64_t, Node> roots_;  // one tree per scope; a root without children is dropped
  std::set<std::pair<uint64_t, Node*>> leaves_;  // unheld leaves by last use
  uint64_t clock_ = 0;
  size_t bytes_ = 0;
  size_t held_bytes_ = 0;
  int64_t nodes_ = 0;
  int64_t lookups_ = 0, hits_ = 0, cached_tokens_ = 0;
};

}  // namespace kettle
