#include "engine/memory_policy.h"

#include <algorithm>

#include "kv/kv_pool.h"
#include "model/model_runner.h"
#include "util/error.h"
#include "util/system_memory.h"

namespace kettle {

WeightStorage weight_storage(const ModelSpec& spec, const Backend& backend) {
  WeightStorage s(backend.host_memory() ? dtype_size(spec.rope_freq_dtype) : 2);
  s.packed_widths = packed_affine_widths(backend, false);
  s.expert_packed_widths = packed_affine_widths(backend, true);
  Linear fp8;  // a 128 × 128 block-scaled FP8 weight
  fp8.scheme = WeightScheme::kFp8;
  fp8.weight = Tensor{nullptr, DType::kF8E4M3, {128, 128}};
  fp8.fp8 = {Tensor{nullptr, DType::kF32, {1, 1}}, 128, 128};
  s.keeps_fp8 = backend.can_run(fp8);
  return s;
}

uint32_t packed_affine_widths(const Backend& backend, bool experts) {
  uint32_t widths = 0;
  for (int bits : {2, 3, 4, 5, 6, 8}) {  // a 16 × 128 weight in groups of 64 with bf16 scales: any shape's kernels
    Linear probe;
    probe.scheme = WeightScheme::kAffine;
    probe.weight = Tensor{nullptr, DType::kU32, {16, 128 * bits / 32}};
    probe.affine = {Tensor{nullptr, DType::kBF16, {16, 2}}, Tensor{nullptr, DType::kBF16, {16, 2}}, bits, 64};
    if (experts ? backend.can_run_expert(probe) : backend.can_run(probe)) widths |= 1u << bits;
  }
  return widths;
}

size_t measured_memory_bytes(Backend& backend, int ranks, double share) {
  if (backend.host_memory())
    return static_cast<size_t>(static_cast<double>(available_memory_bytes() / static_cast<size_t>(std::max(1, ranks))) *
                               share);
  const size_t free = backend.free_memory();
  if (share >= 1.0) return free;
  return std::min(free, static_cast<size_t>(static_cast<double>(backend.total_memory()) * share));
}

MemoryDecision decide_memory(const ModelSpec& spec, Backend& backend, const MemoryFlags& flags) {
  return decide_memory(spec, !backend.host_memory(), weight_storage(spec, backend), backend.kv_dtype(),
                       measured_memory_bytes(backend, flags.ranks, flags.device_share), flags);
}

MemoryDecision decide_memory(const ModelSpec& spec, bool device_memory, WeightStorage weights, DType kv_element,
                             size_t device_bytes, const MemoryFlags& flags) {
  MemoryDecision d;
  d.plan = plan_memory(spec, flags.ranks, weights, kv_layout(spec, kv_element, flags.ranks, flags.kv_quant),
                       flags.prefill_chunk);
  d.reserve_kv = device_memory;
  d.device_bytes = flags.memory_budget_gb ? static_cast<size_t>(*flags.memory_budget_gb * 1e9) : device_bytes;
  const size_t fixed = d.plan.weight_bytes + flags.other_weight_bytes + d.plan.working_bytes;
  if (flags.memory_budget_gb && d.device_bytes <= fixed)
    fail(ErrorCategory::kInvalidArgument,
         "--memory-budget {:.2f} GB does not hold the model's weights ({:.2f} GB) plus {:.2f} GB of working memory",
         *flags.memory_budget_gb, static_cast<double>(d.plan.weight_bytes) / 1e9,
         static_cast<double>(d.plan.working_bytes) / 1e9);
  const size_t left = d.device_bytes > fixed ? d.device_bytes - fixed : 0;
  // An explicit --memory-budget gives the KV cache all that is left; otherwise its share.
  const double share = flags.memory_budget_gb ? 1.0 : device_memory ? kDeviceKvShare : kHostKvShare;
  d.kv_budget_bytes = static_cast<size_t>(static_cast<double>(left) * share);
  if (flags.kv_budget_gb) {
    // Host ranks share one RAM: the flag's bytes are split; a GPU rank has its own memory.
    const double bytes = *flags.kv_budget_gb * 1e9 / (device_memory ? 1 : flags.ranks);
    const auto asked = static_cast<size_t>(bytes);
    d.kv_budget_bytes = flags.memory_budget_gb ? std::min(asked, d.kv_budget_bytes) : asked;
  }
  d.prompt_cache_bytes = std::min(static_cast<size_t>(flags.prompt_cache_gb * 1e9), d.kv_budget_bytes);
  return d;
}

int64_t admitted_context(const MemoryDecision& d, int64_t batch, int64_t limit) {
  const int64_t block = KvPool::kDefaultBlockSize;
  return std::min(d.plan.longest_context(d.kv_budget_bytes, batch) / block * block, limit);
}

}  // namespace kettle
