// How an engine is set up (serve's flags, bench's, the tests'): nothing of the
// model or the KV store in it but the KV policy, a value (kv/kv_quant.h), so the
// server can hold one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/speculation.h"
#include "kv/kv_quant.h"
#include "kv/ssd_tier.h"

namespace kettle {

struct EngineOptions {
  int batch = 8;                 // sequences decoded together; 1: strictly one at a time
  int64_t prefill_chunk = 2048;  // prompt tokens per step, beside the running decodes
  size_t kv_budget_bytes = 0;    // the KV pool's cap, per rank (memory_policy.h decides it); 0: none
  bool reserve_kv = false;       // allocate the whole budget at start (a GPU server does, as vLLM)
  size_t prompt_cache_bytes = 0;  // the prefix cache's cap (the blocks it alone keeps); 0: off
  static constexpr int kDefaultKvBlockSize = 16;
  int kv_block_size = kDefaultKvBlockSize;  // tokens per KV block (and per cached prefix block)
  KvQuant kv_quant;              // how KV rows are stored (--kv-quant); the pool's, cached prefixes included
  SsdOptions ssd;                // the prefix cache's disk tier (--ssd-cache); dir empty: none
  int64_t checkpoint_every = 0;  // --generation-checkpoint: a generation's state to disk every N tokens; 0: never
  SpeculationOptions speculation;  // --draft-kind and its flags (engine/speculation.h)
};

}  // namespace kettle
