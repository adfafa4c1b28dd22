// --kv-quant on every golden case's model (tests/data/goldens, goldens-demo), CPU:
// under each mode, continuous batching changes no token (each sequence batched
// equals it alone, shared prefixes adopted from quantized blocks), and the 24
// greedy tokens' agreement with transformers' (what `off` reproduces exactly,
// golden_test) is reported per mode, with a floor per mode.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "backend/backend.h"
#include "golden/batch_equivalence.h"
#include "golden/golden_cases.h"
#include "kv/kv_quant.h"

namespace kettle {
namespace {

using namespace golden;

const std::vector<std::string> kModes = {"8", "4", "fp8", "turbo", "config"};

// `config` here: 8 bits in groups of 16 on the even layers, 4 on the odd ones.
KvQuant mode_for(const std::string& mode, const Model& model) {
  if (mode != "config") return parse_kv_quant(mode);
  KvQuant q;
  q.mode = KvQuant::Mode::kConfig;
  for (int64_t i = 0; i < static_cast<int64_t>(model.spec.layers.size()); ++i)
    q.layers.push_back({i, i % 2 == 0 ? 8 : 4, 16});
  return q;
}

class KvQuantGoldenTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(KvQuantGoldenTest, ContinuousBatchingChangesNoToken) {
  const auto& [name, mode] = GetParam();
  auto backend = make_cpu_backend(2);
  Model model = load_model(model_dir(name));
  expect_batching_changes_no_token(*backend, name, mode_for(mode, model));
}

INSTANTIATE_TEST_SUITE_P(Cases, KvQuantGoldenTest, ::testing::Combine(::testing::ValuesIn(case_names()), ::testing::ValuesIn(kModes)),
                         [](const auto& info) {
                           std::string mode = std::get<1>(info.param);
                           for (char& c : mode) c = c == ':' ? '_' : c;
                           return case_label(std::get<0>(info.param)) + "_" + mode;
                         });

// Greedy tokens equal to transformers' before the first difference, over every case: the
// share of the 24 per case, per mode. The floors sit under what the codecs give these
// models (tiny random weights, whose next-token margins are thin) with room to spare.
TEST(KvQuantGolden, GreedyAgreementWithTheReferencePerMode) {
  const std::map<std::string, double> floor = {{"8", 0.8}, {"fp8", 0.5}, {"4", 0.4}, {"turbo", 0.35}, {"config", 0.6}};
  auto backend = make_cpu_backend(2);
  for (const std::string& mode : kModes) {
    int64_t agreed = 0, total = 0;
    std::string per_case;
    for (const std::string& name : case_names()) {
      Golden g = read_golden(case_dir(name));
      Model model = load_model(model_dir(name));
      StandaloneRunner runner = make_standalone_runner(model, {backend.get()}, {}, mode_for(mode, model));
      const std::vector<int32_t> tokens = alone(*runner, g.prompt, static_cast<int>(g.greedy.size()));
      size_t same = 0;
      while (same < tokens.size() && tokens[same] == g.greedy[same]) ++same;
      agreed += static_cast<int64_t>(same);
      total += static_cast<int64_t>(g.greedy.size());
      per_case += " " + case_label(name) + "=" + std::to_string(same);
    }
    const double share = static_cast<double>(agreed) / static_cast<double>(total);
    std::printf("# --kv-quant %-6s greedy agreement with transformers: %.1f %% of tokens before the first difference;%s\n",
                mode.c_str(), 100.0 * share, per_case.c_str());
    EXPECT_GE(share, floor.at(mode)) << mode;
  }
}

}  // namespace
}  // namespace kettle
