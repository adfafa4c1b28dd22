#include "model/memory_plan.h"

#include <algorithm>
#include <string>

#include "model/arch/arch_table.h"
#include "model/model_runner.h"
#include "model/tensor_parallel.h"

namespace kettle {
size_t MemoryPlan::kv_bytes(int64_t tokens, int64_t sequences) const {
  const int64_t windowed = window > 0 ? std::min(tokens, window) : tokens;
  return static_cast<size_t>(sequences) *
         (static_cast<size_t>(tokens) * kv_bytes_per_token + static_cast<size_t>(windowed) * window_kv_bytes_per_token);
}

size_t MemoryPlan::total_bytes(int64_t tokens, int64_t sequences) const {
  return weight_bytes + working_bytes + kv_bytes(tokens, sequences);
}

int64_t MemoryPlan::max_context(size_t device_bytes, int64_t sequences) const {
  if (device_bytes <= weight_bytes + working_bytes) return 0;
  return longest_context(device_bytes - weight_bytes - working_bytes, sequences);
}

int64_t MemoryPlan::longest_context(size_t kv_budget, int64_t sequences) const {
  int64_t lo = 0, hi = int64_t{1} << 40;  // the largest length whose KV fits (KV grows with the length)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (kv_bytes(mid, sequences) <= kv_budget) lo = mid; else hi = mid - 1;
  }
  return lo;
}

namespace {

// Bytes of `elements` of the matrix at module `path` as the backend keeps it.
class MatrixBytes {
 public:
  MatrixBytes(const ModelSpec& s, WeightStorage storage) : spec_(s), storage_(storage) {}
  // in: its input width (a width its groups do not divide stays float, as convert and
  // mlx-lm leave it); expert: a MoE router or experts' stacked matrix (Backend::can_run_expert).
  size_t operator()(const std::string& path, size_t elements, int64_t in, bool expert = false) const {
    const QuantParams q = spec_.quant.for_module(path);
    const QuantMethod method = spec_.quant.method;
    const bool zero_point = method == QuantMethod::kAwq || method == QuantMethod::kGptq;
    const bool head_or_table = path == "model.embed_tokens" || path == "lm_head";
    // FP8: codes and an f32 scale per block (or row) where the backend keeps them (not in
    // experts, whose kernels read bf16), else widened; the embedding and the head as
    // FP8 checkpoints publish them, in floats.
    if (method == QuantMethod::kFp8) {
      if (!q.quantized || head_or_table || expert || !storage_.keeps_fp8) return elements * storage_.value_bytes;
      const size_t rows = elements / static_cast<size_t>(in);
      const int64_t b0 = spec_.quant.fp8_block[0], b1 = spec_.quant.fp8_block[1];
      const size_t scales = b0 > 0 ? ((rows + b0 - 1) / b0) * ((static_cast<size_t>(in) + b1 - 1) / b1) : rows;
      return elements + scales * sizeof(float);
    }
    // AWQ and GPTQ leave the embedding and the head in floats.
    if (!q.quantized || in % q.group_size != 0 || !storage_.keeps(q.bits, expert) || (zero_point && head_or_table))
      return elements * storage_.value_bytes;
    // Codes, then a scale and a bias per group: the checkpoint's float type (MLX), f32
    // (AWQ and GPTQ, repacked).
    const size_t groups = elements / static_cast<size_t>(q.group_size);
    const size_t scale_bytes = zero_point ? 4 : dtype_size(spec_.rope_freq_dtype);
    return elements * static_cast<size_t>(q.bits) / 8 + groups * 2 * scale_bytes;
  }

 private:
  const ModelSpec& spec_;
  WeightStorage storage_;
};

}  // namespace

MemoryPlan plan_memory(const ModelSpec& s, int ranks, WeightStorage weights, size_t kv_value_bytes,
                       int64_t prefill_chunk) {
  return plan_memory(s, ranks, weights, kv_layout(s, kv_value_bytes == 4 ? DType::kF32 : DType::kF16, ranks),
                     prefill_chunk);
}

MemoryPlan plan_memory(const ModelSpec& s, int ranks, WeightStorage weights, const KvLayout& kv_rows,
                       int64_t prefill_chunk) {
  check_splittable(s, ranks);
  MemoryPlan plan;
  plan.ranks = ranks;
  const MatrixBytes matrix(s, weights);
  const size_t value = weights.value_bytes;
  const auto h = static_cast<size_t>(s.hidden_size), n = static_cast<size_t>(ranks);
  const size_t q = static_cast<size_t>(s.q_size()) / n, kv = static_cast<size_t>(s.kv_size()) / n;
  size_t split = 0, replicated = 0;  // bytes per rank
  int64_t moe_inter = 0;
  const std::string moe_block = s.n_experts > 0 ? std::string(arch_table(s.model_type, "config.json").moe_block) : "";
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    // q, k, v (rows) and o (columns)
    const int64_t hidden = s.hidden_size;
    split += matrix(layer + "self_attn.q_proj", q * h, hidden) + matrix(layer + "self_attn.k_proj", kv * h, hidden) +
             matrix(layer + "self_attn.v_proj", kv * h, hidden) + matrix(layer + "self_attn.o_proj", q * h, s.q_size());
    if (l.moe) {
      moe_inter = std::max(moe_inter, s.expert_intermediate_size);
      // Experts at the bits config.json gives mlx-lm's stacked modules, the router its own.
      const std::string block = layer + moe_block + ".";
      const size_t expert = static_cast<size_t>(s.n_experts) * static_cast<size_t>(s.expert_intermediate_size) * h;
      split += matrix(block + "switch_mlp.gate_proj", expert, hidden, true) +
               matrix(block + "switch_mlp.up_proj", expert, hidden, true) +
               matrix(block + "switch_mlp.down_proj", expert, s.expert_intermediate_size, true);
      replicated += matrix(block + "gate", static_cast<size_t>(s.n_experts) * h, hidden, true);
    } else {
      const size_t inter = static_cast<size_t>(s.intermediate_size) / n * h;  // gate, up (rows) and down (columns)
      split += matrix(layer + "mlp.gate_proj", inter, hidden) + matrix(layer + "mlp.up_proj", inter, hidden) +
               matrix(layer + "mlp.down_proj", inter, s.intermediate_size);
    }
    replicated += (s.sandwich_norms ? 4 : 2) * h * value;  // norms (per-head q/k norms, a few hundred values, not counted)
    const size_t layer_kv = kv_rows.token_bytes(i);
    if (l.sliding_window > 0) {
      plan.window_kv_bytes_per_token += layer_kv;
      plan.window = std::max<int64_t>(plan.window, l.sliding_window);
    } else {
      plan.kv_bytes_per_token += layer_kv;
    }
  }
  const size_t vocab = static_cast<size_t>(s.vocab_size);
  const size_t embed = matrix("model.embed_tokens", vocab * h, s.hidden_size);
  const size_t head = s.tie_word_embeddings ? matrix("model.embed_tokens", (vocab + n - 1) / n * h, s.hidden_size)
                                            : matrix("lm_head", (vocab + n - 1) / n * h, s.hidden_size);
  replicated += h * value;  // the final norm
  // The LM head: its own rows per rank; tied to the embedding on one rank it is the same memory.
  const size_t head_bytes = s.tie_word_embeddings && ranks == 1 ? 0 : head;
  plan.weight_bytes = split + replicated + embed + head_bytes;
  plan.streamed_bytes = split + replicated + head;
  // A prefill step of `prefill_chunk` tokens: the residual stream and its copies, q/k/v,
  // attention output and the MLP's gate|up in f32, and its last rows' logits.
  const size_t inter = static_cast<size_t>(std::max(s.intermediate_size, moe_inter)) / n;
  const size_t per_token = 4 * h + (q + 2 * kv) + 2 * q + 2 * inter;
  plan.working_bytes = static_cast<size_t>(prefill_chunk) * per_token * sizeof(float) + kWorkingAllowanceBytes;
  return plan;
}

}  // namespace kettle
