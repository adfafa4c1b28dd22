// MemoryPlan against independent counts: Llama 3.1 8B's published parameter
// count and KV size, and the bytes of the tensors an actual shard holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <utility>

#include "model/memory_plan.h"
#include "model/model.h"
#include "model/quantize_checkpoint.h"
#include "model/synthetic.h"
#include "model/tensor_parallel.h"
#include "util/error.h"

namespace kettle {
namespace {

// The MoE presets against their model cards: Qwen3-30B-A3B "30.5B in total, 3.3B
// activated", Mixtral 8x7B "46.7B total parameters".
TEST(MemoryPlan, MoePresetsMatchTheirPublishedSizes) {
  const ModelSpec qwen = synthetic_spec("qwen3-30b-a3b");
  EXPECT_EQ(qwen.n_experts, 128);
  EXPECT_EQ(qwen.experts_per_token, 8);
  EXPECT_EQ(qwen.expert_intermediate_size, 768);
  const double qwen_params = static_cast<double>(plan_memory(qwen, 1, 2, 2).weight_bytes) / 2;
  EXPECT_NEAR(qwen_params / 1e9, 30.5, 0.1);
  const ModelSpec mixtral = synthetic_spec("mixtral-8x7b");
  EXPECT_EQ(mixtral.n_experts, 8);
  EXPECT_EQ(mixtral.experts_per_token, 2);
  const double mixtral_params = static_cast<double>(plan_memory(mixtral, 1, 2, 2).weight_bytes) / 2;
  EXPECT_NEAR(mixtral_params / 1e9, 46.7, 0.1);
}

// A decode step reads each MoE layer's chosen experts only: the tiny Qwen3-MoE golden
// (2 layers of 8 experts, top 2, hidden 64, expert width 48, bf16) reads 6 of 8 experts less.
TEST(MemoryPlan, DecodeReadsOnlyTheChosenExpertsShare) {
  const Model model = load_model(std::string(KETTLE_TEST_DATA) + "/goldens/qwen3_moe/model");
  // A token reads top_k of n experts and one row of the (untied) embedding table.
  const size_t expert_bytes = size_t{3} * 64 * 48 * 2, table_bytes = size_t{512} * 64 * 2;
  EXPECT_EQ(model.weight_bytes() - model.decode_bytes_per_token(), size_t{2} * (8 - 2) * expert_bytes + table_bytes);
  const Model dense = make_synthetic_model("tiny");
  EXPECT_EQ(dense.weight_bytes() - dense.decode_bytes_per_token(), table_bytes);
}

TEST(MemoryPlan, Llama31_8bWeightsAndKvMatchItsPublishedSize) {
  const ModelSpec spec = synthetic_spec("llama-3.1-8b");
  const MemoryPlan plan = plan_memory(spec, 1, 2, 2);
  EXPECT_EQ(plan.weight_bytes, size_t{8030261248} * 2);  // 8,030,261,248 parameters in bf16
  EXPECT_EQ(plan.kv_bytes_per_token, size_t{32} * 2 * 8 * 128 * 2);  // layers × (k, v) × KV heads × head_dim × f16
  EXPECT_EQ(plan.kv_bytes(8192), size_t{8192} * plan.kv_bytes_per_token);
  // The longest context fits exactly: one more token would not.
  const size_t device = size_t{40} << 30;
  const int64_t longest = plan.max_context(device, 4);
  EXPECT_LE(plan.total_bytes(longest, 4), device);
  EXPECT_GT(plan.total_bytes(longest + 1, 4), device);
  EXPECT_EQ(plan.max_context(plan.weight_bytes, 1), 0);
}

TEST(MemoryPlan, QuantizedMatricesCountTheirCodesScalesAndBiases) {
  // llama-3.1-8b at 4 bits in groups of 64: every matrix (embedding and head included) at
  // half a byte per weight plus a bf16 scale and bias per 64; the 266,240 norm weights stay bf16.
  const ModelSpec spec = synthetic_spec("llama-3.1-8b", {4, 64});
  const size_t norms = 32 * 2 * 4096 + 4096, matrices = size_t{8030261248} - norms;
  EXPECT_EQ(plan_memory(spec, 1, WeightStorage(2, true), 2).weight_bytes, matrices / 2 + matrices / 64 * 4 + norms * 2);
  // A backend that widens them keeps bf16.
  EXPECT_EQ(plan_memory(spec, 1, WeightStorage(2, false), 2).weight_bytes, size_t{8030261248} * 2);
  // A module the config leaves at 8 bits counts at 8.
  ModelSpec mixed = spec;
  mixed.quant.modules["lm_head"] = {true, 8, 64};
  const size_t head = size_t{128256} * 4096;
  EXPECT_EQ(plan_memory(mixed, 1, WeightStorage(2, true), 2).weight_bytes - plan_memory(spec, 1, WeightStorage(2, true), 2).weight_bytes,
            head / 2);
  // A backend that keeps only 4- and 8-bit weights packed (CUDA) widens a 3-bit one to bf16.
  ModelSpec three = spec;
  three.quant.modules["lm_head"] = {true, 3, 64};
  const WeightStorage gpu = WeightStorage::packed(2, {4, 8});
  EXPECT_EQ(plan_memory(three, 1, gpu, 2).weight_bytes - plan_memory(spec, 1, gpu, 2).weight_bytes,
            head * 2 - (head / 2 + head / 64 * 4));
  EXPECT_EQ(plan_memory(three, 1, WeightStorage(2, true), 2).weight_bytes - plan_memory(spec, 1, WeightStorage(2, true), 2).weight_bytes,
            head * 3 / 8 - head / 2);
}

// llama-3.1-8b in block-wise FP8 (128 × 128, as DeepSeek and Qwen publish): its 7.0 B
// projection weights at a byte each and an f32 scale per block, the embedding, the head
// and the norms in bf16, where the backend keeps FP8 (CUDA on Hopper); all bf16 where it
// widens them.
TEST(MemoryPlan, Fp8MatricesCountTheirCodesAndBlockScales) {
  SyntheticQuant fp8;
  fp8.fp8 = true;
  const ModelSpec spec = synthetic_spec("llama-3.1-8b", fp8);
  const size_t h = 4096, kv = 1024, inter = 14336, vocab = 128256, layers = 32, norms = 32 * 2 * 4096 + 4096;
  const size_t per_layer = 2 * h * h + 2 * kv * h + 3 * inter * h;
  const size_t blocks = (2 * 32 * 32 + 2 * 8 * 32 + 3 * 112 * 32) * layers;
  WeightStorage hopper = WeightStorage::packed(2, {4, 8});
  hopper.keeps_fp8 = true;
  EXPECT_EQ(plan_memory(spec, 1, hopper, 2).weight_bytes, per_layer * layers + blocks * 4 + 2 * vocab * h * 2 + norms * 2);
  EXPECT_EQ(plan_memory(spec, 1, WeightStorage::packed(2, {4, 8}), 2).weight_bytes, size_t{8030261248} * 2);
}

// Bytes of every distinct tensor a model (or shard) holds: a view of other rows is its own
// copy on a device, so tensors count by address and size.
size_t held_bytes(const ModelWeights& w) {
  std::set<std::pair<const void*, int64_t>> seen;
  size_t total = 0;
  const auto count = [&](const Tensor& t) {
    if (!t.empty() && seen.insert({t.data, t.numel()}).second) total += t.nbytes();
  };
  count(w.embed.weight);
  count(w.lm_head.weight);
  count(w.final_norm);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.attn_post_norm, &l.ffn_norm, &l.ffn_post_norm}) count(*t);
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.qkv, &l.o, &l.gate, &l.up, &l.gate_up, &l.down}) count(p->weight);
  }
  return total;
}

// A quantized MoE checkpoint (the Qwen3-MoE golden through convert -q: stacked experts at
// 4 bits, routers at 8, expert down projections too narrow for the groups left bf16): the
// plan counts what the checkpoint holds (but its per-head q/k norm vectors), and a backend
// whose MoE kernels read bf16 (CUDA) the experts and routers widened.
TEST(MemoryPlan, QuantizedExpertsCountAsTheBackendKeepsThem) {
  const std::string dir = ::testing::TempDir() + "kettle-plan-moe-q4";
  std::filesystem::remove_all(dir);
  QuantizeOptions options;
  options.bits = 4;
  options.group_size = 32;
  const QuantizeReport report =
      quantize_checkpoint(std::string(KETTLE_TEST_DATA) + "/goldens/qwen3_moe/model", dir, options);
  const Model model = load_model(dir);
  size_t qk_norms = 0, widening = 0;
  for (const LayerWeights& l : model.weights.layers) {
    qk_norms += l.q_norm.nbytes() + l.k_norm.nbytes();
    std::vector<const Linear*> read_as_bf16 = {&l.router};
    for (const ExpertWeights& e : l.experts) read_as_bf16.insert(read_as_bf16.end(), {&e.gate, &e.up, &e.down});
    for (const Linear* p : read_as_bf16)
      if (p->scheme == WeightScheme::kAffine)
        widening += static_cast<size_t>(p->out_features() * p->in_features()) * 2 - p->weight_bytes();
  }
  EXPECT_GT(widening, 0u);
  const MemoryPlan packed = plan_memory(model.spec, 1, WeightStorage(2, true), 2);
  EXPECT_EQ(packed.weight_bytes, report.bytes_out - qk_norms);
  WeightStorage gpu = WeightStorage::packed(2, {4, 8});
  EXPECT_EQ(plan_memory(model.spec, 1, gpu, 2).weight_bytes, packed.weight_bytes + widening);
  std::filesystem::remove_all(dir);
}

TEST(MemoryPlan, ShardWeightsMatchTheTensorsAShardHolds) {
  const Model model = make_synthetic_model("tiny");
  for (int ranks : {1, 2}) {
    const MemoryPlan plan = plan_memory(model.spec, ranks, 2, 4);
    for (int r = 0; r < ranks; ++r) {
      const ModelShard shard = shard_model(model, r, ranks);
      EXPECT_EQ(plan.weight_bytes, held_bytes(shard.model.weights)) << "rank " << r << " of " << ranks;
    }
    EXPECT_EQ(plan.kv_bytes_per_token, static_cast<size_t>(model.spec.n_layers * 2 * model.spec.kv_size() / ranks * 4));
  }
  EXPECT_THROW(plan_memory(model.spec, 3, 2, 4), Error);  // 4 heads do not split 3 ways
}

}  // namespace
}  // namespace kettle
