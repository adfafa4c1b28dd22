// The one memory policy: how much of a device `serve`, `fit` and `bench` give
// the weights, the working memory of a step, the KV cache and the prompt cache,
// decided from the model's MemoryPlan (its config alone) and the device's
// memory measured before the model loads, with one set of constants. `fit`
// reports exactly the KV budget `serve` allocates for the same model and flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "kv/kv_quant.h"
#include "model/memory_plan.h"
#include "model/model_spec.h"

namespace kettle {

// Of the memory left after the weights and the working memory, the KV cache gets this
// share unless a flag says otherwise: most of a GPU (its memory is there to be used, as
// vLLM's gpu_memory_utilization), a quarter of the host's RAM (other programs live there).
constexpr double kDeviceKvShare = 0.9;
constexpr double kHostKvShare = 0.25;

struct MemoryFlags {
  std::optional<double> kv_budget_gb;      // --kv-budget: the KV cache's size outright
  std::optional<double> memory_budget_gb;  // --memory-budget: weights + working + KV together, per rank
  double prompt_cache_gb = 0.0;            // --prompt-cache: the cached prefixes' share of the KV cache
  int64_t prefill_chunk = 2048;
  int ranks = 1;
  KvQuant kv_quant;  // --kv-quant: how the KV rows are stored
  size_t other_weight_bytes = 0;  // held beside the model's (a draft model's weights), per rank
  double device_share = 1.0;      // --device-share: this server's share of the device (a --model-pool engine's)
};

struct MemoryDecision {
  MemoryPlan plan;              // per rank: weights, working memory, KV bytes per token
  size_t device_bytes = 0;      // per rank: what the policy divides (measured, or --memory-budget)
  size_t kv_budget_bytes = 0;   // per rank: the KV pool's cap
  size_t prompt_cache_bytes = 0;
  bool reserve_kv = false;      // a GPU allocates its KV cache at start
};

// Bytes a rank of `backend`'s kind holds per weight element: bf16 on a GPU, the
// checkpoint's own type in host memory (mapped as stored).
WeightStorage weight_storage(const ModelSpec& spec, const Backend& backend);

// The affine widths `backend` keeps packed (WeightStorage::packed_widths, or with
// `experts` expert_packed_widths): those its kernels (or its MoE kernels) run; it widens
// the others to bf16 at load.
uint32_t packed_affine_widths(const Backend& backend, bool experts);

// What a rank of `backend`'s kind has now: a GPU's free memory, or the host's available
// RAM split over `ranks` (they share it). With `share` < 1 (serve --device-share, each engine
// of a --model-pool), that share of it: of the GPU's whole memory, never more than is free.
size_t measured_memory_bytes(Backend& backend, int ranks, double share = 1.0);

// The decision for `spec` on `backend` (rank 0's; host ranks share one RAM). Throws
// kettle::Error (kInvalidArgument) naming --memory-budget when it cannot hold the weights
// and the working memory.
MemoryDecision decide_memory(const ModelSpec& spec, Backend& backend, const MemoryFlags& flags);

// The longest context (prompt plus max_tokens) `batch` sequences may have under the decision's KV
// budget, in whole KV blocks as the pool admits them (serve's default block size), at most `limit`:
// what `serve` with the same flags accepts (`fit`, `ls`).
int64_t admitted_context(const MemoryDecision& d, int64_t batch, int64_t limit);

// As decide_memory, with the device's memory given (fit's --skus table, tests).
MemoryDecision decide_memory(const ModelSpec& spec, bool device_memory, WeightStorage weights, DType kv_element,
                             size_t device_bytes, const MemoryFlags& flags);

}  // namespace kettle
