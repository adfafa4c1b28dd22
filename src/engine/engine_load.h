// What the engine reports about itself (GET /stats, /metrics): generations
// running and waiting, the KV pool and the prefix cache. Plain counters, so a
// reader needs nothing of the model or the KV store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kettle {

struct KvLoad {
  int block_size = 0;
  int64_t blocks_used = 0;    // held by a sequence or the prefix cache
  int64_t blocks_free = 0;    // free now or by growing the pool to its cap
  size_t bytes_used = 0;
  size_t bytes_allocated = 0;
  size_t bytes_reserved = 0;  // the running generations' admitted worst case
  size_t budget_bytes = 0;    // the pool's cap; 0: none
  std::string quant = "off";  // how rows are stored (--kv-quant)
  size_t bytes_per_token = 0;  // a token's keys and values across the layers, as stored (one rank)
};

struct PromptCacheLoad {
  int64_t lookups = 0;
  int64_t hits = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the cache, summed
  int64_t entries = 0;        // blocks held
  size_t bytes = 0;
  size_t held_bytes = 0;      // shared with running generations (not charged to the cap)
  size_t capacity_bytes = 0;
};

struct EngineLoad {
  int running = 0;  // generations on the engine now
  int queued = 0;   // waiting for it
  PromptCacheLoad prefix_cache;
  KvLoad kv;
};

}  // namespace kettle
