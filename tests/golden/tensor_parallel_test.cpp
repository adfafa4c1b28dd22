// Tensor parallelism's split logic on the CPU (issue 8): every golden model cut
// into shards (heads, intermediate and LM-head vocabulary split; row-parallel
// outputs summed, logits gathered through HostGroup, one thread per rank) must
// reproduce transformers' prompt logits (relative error ≤ 1e-4 per position, the
// bound of the unsplit CPU check) and its 24 greedy tokens, with every rank
// holding the same logits. A split the model's shape does not allow is refused
// with an error naming the quantity.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/host_collective.h"
#include "golden/batch_equivalence.h"
#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "model/tensor_parallel_runner.h"
#include "model/decoder_runner.h"
#include "util/error.h"

namespace kettle {
namespace {

using namespace golden;

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

struct SplitRun {
  std::vector<std::vector<float>> prompt_logits;  // per rank: [positions, vocab]
  std::vector<std::vector<int32_t>> tokens;       // per rank: the greedy continuation
};

// The prompt through `ranks` shards in lockstep, then greedy decoding of `count` tokens.
SplitRun run_split(const Model& model, int ranks, const std::vector<int32_t>& prompt, size_t count) {
  std::vector<ModelShard> shards;
  HostGroup group(ranks);
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Collective>> members;
  std::vector<std::unique_ptr<KvPool>> pools;
  std::vector<std::unique_ptr<DecoderRunner>> transformers;
  for (int r = 0; r < ranks; ++r) shards.push_back(shard_model(model, r, ranks));
  for (int r = 0; r < ranks; ++r) {
    backends.push_back(make_cpu_backend(1));
    members.push_back(group.member(r));
    pools.push_back(make_kv_pool(shards[static_cast<size_t>(r)].model.spec, {backends.back().get()}));
    transformers.push_back(std::make_unique<DecoderRunner>(shards[static_cast<size_t>(r)].model, *backends.back(),
                                                         *pools.back(),
                                                         tensor_parallel_of(shards[static_cast<size_t>(r)], *members.back())));
  }
  const auto positions = static_cast<int64_t>(prompt.size());
  SplitRun run{std::vector<std::vector<float>>(static_cast<size_t>(ranks)),
               std::vector<std::vector<int32_t>>(static_cast<size_t>(ranks))};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      DecoderRunner& t = *transformers[static_cast<size_t>(r)];
      const int64_t vocab = t.vocab();
      KvCache kv = t.new_cache();
      std::vector<float>& logits = run.prompt_logits[static_cast<size_t>(r)];
      logits.assign(static_cast<size_t>(positions * vocab), NAN);
      t.forward(prompt.data(), positions, kv, LogitsFor::kAllTokens, logits.data());
      std::vector<int32_t>& out = run.tokens[static_cast<size_t>(r)];
      int32_t next = argmax(logits.data() + (positions - 1) * vocab, vocab);
      while (out.size() < count) {
        out.push_back(next);
        if (out.size() < count) next = t.forward_greedy(&next, 1, kv);
      }
    });
  for (std::thread& th : threads) th.join();
  return run;
}

bool splits(const ModelSpec& s, int ranks) {
  bool moe = false;
  for (const LayerSpec& l : s.layers) moe = moe || l.moe;
  return s.n_heads % ranks == 0 && s.n_kv_heads % ranks == 0 && s.intermediate_size % ranks == 0 && !moe;
}

class TensorParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelTest, ShardsSummedEqualTheWholeModel) {
  Golden g = read_golden(case_dir(GetParam()));
  Model model = load_model(model_dir(GetParam()));
  int ran = 0;
  for (int ranks : {2, 3, 4}) {
    if (!splits(model.spec, ranks)) {
      try {
        shard_model(model, 0, ranks);
        ADD_FAILURE() << ranks << " ranks: a model that cannot split was split";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--tensor-parallel " + std::to_string(ranks)), std::string::npos) << e.what();
      }
      continue;
    }
    ++ran;
    SplitRun run = run_split(model, ranks, g.prompt, g.greedy.size());
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float>& logits = run.prompt_logits[static_cast<size_t>(r)];
      EXPECT_EQ(logits, run.prompt_logits[0]) << "rank " << r << " of " << ranks << " holds other logits";
      EXPECT_EQ(run.tokens[static_cast<size_t>(r)], g.greedy) << "rank " << r << " of " << ranks;
    }
    for (int64_t p = 0; p < g.positions; ++p)
      EXPECT_LE(relative_error(run.prompt_logits[0].data() + p * g.vocab, g.logits.data() + p * g.vocab, g.vocab), 1e-4)
          << "position " << p << ", " << ranks << " ranks";
  }
  bool moe = false;
  for (const LayerSpec& l : model.spec.layers) moe = moe || l.moe;
  if (!moe) {
    EXPECT_GT(ran, 0) << "no split of this model was run";
  }
}

// The engine over two ranks sharing one block bookkeeping: sequences of mixed lengths
// (some sharing a prefix) joining in waves and prefilling in 7-token chunks beside
// decodes get the tokens the whole model gives each of them alone.
TEST_P(TensorParallelTest, RunnerBatchesLikeTheWholeModel) {
  Golden g = read_golden(case_dir(GetParam()));
  Model model = load_model(model_dir(GetParam()));
  auto rank0 = make_cpu_backend(1), rank1 = make_cpu_backend(1);
  const std::vector<Backend*> backends{rank0.get(), rank1.get()};
  if (!splits(model.spec, 2)) {
    EXPECT_THROW(EngineCore(model, nullptr, backends, EngineOptions{}), Error);
    return;
  }
  auto whole_backend = make_cpu_backend(1);
  expect_batched_equals_alone(model, backends, *whole_backend, g.prompt);
}

INSTANTIATE_TEST_SUITE_P(Cases, TensorParallelTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return case_label(info.param); });

}  // namespace
}  // namespace kettle
