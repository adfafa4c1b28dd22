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

// The prefix cache's disk tier (--ssd-cache); all zero when there is none.
struct SsdLoad {
  bool enabled = false;
  bool spilling = false;        // false once the disk refused a write
  bool scanning = false;        // the start-up index scan is running
  int64_t entries = 0;
  size_t bytes = 0;
  size_t max_bytes = 0;         // 0: unlimited
  int64_t hits = 0;             // prompts that found blocks on disk
  int64_t restores = 0;         // blocks read back
  size_t restore_bytes = 0;
  double restore_seconds = 0.0;
  int64_t written = 0;
  size_t written_bytes = 0;
  int64_t queued = 0;           // the spill queue
  size_t queued_bytes = 0;
  int64_t dropped = 0;          // spills not taken (queue full, spilling stopped, shutdown)
  int64_t errors = 0;
  int64_t removed = 0;          // bad or foreign files removed, entries evicted past the cap
  int64_t checkpoints = 0;      // generation checkpoints on disk (--generation-checkpoint)
  int64_t checkpoints_written = 0;
  int64_t resumed = 0;          // generations resumed from one
};

// Speculative decoding (--draft-kind); all zero without it.
struct SpeculationLoad {
  std::string kind = "none";
  int max_drafts = 0;
  int64_t drafted = 0;   // tokens drafted, summed over every generation
  int64_t accepted = 0;  // of them, accepted
  int64_t verifies = 0;  // verify entries run
  int64_t emitted = 0;   // tokens those verifies produced (accepted drafts and the target's own)
};

struct EngineLoad {
  int running = 0;  // generations on the engine now
  int queued = 0;   // waiting for it
  PromptCacheLoad prefix_cache;
  KvLoad kv;
  SsdLoad ssd;
  SpeculationLoad speculation;
};

// What POST /admin/cache/flush (and a durable shutdown) found: durable when every block
// the cache holds is on disk.
struct CacheFlushReport {
  bool durable = false;
  int64_t not_on_disk = 0;  // cached blocks not (yet) on disk
  int64_t queued = 0;       // of them, waiting to be written
  int64_t written = 0;      // entries written since start
  int64_t dropped = 0;
  int64_t errors = 0;
  bool spilling = false;
};

}  // namespace kettle
