// Continuous batching must not change a token: sequences of mixed lengths, some
// sharing a prefix (adopted from the prefix cache), join the engine's running
// batch in waves, prefill in small chunks beside the running decodes (the
// engine's own step loop, the one serve runs), and decode greedily with the
// token drawn where the logits live — and each must produce exactly the tokens
// it produces alone on a runner of its own. Used by the CPU and the CUDA golden
// tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "golden/golden_cases.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "support/token_sink.h"

namespace kettle::golden {

// Prompts of mixed lengths from one golden prompt: prefixes of it (sharing blocks) and
// rotations (sharing nothing).
inline std::vector<std::vector<int32_t>> mixed_prompts(const std::vector<int32_t>& base, int count) {
  std::vector<std::vector<int32_t>> prompts;
  const auto n = static_cast<int64_t>(base.size());
  for (int i = 0; i < count; ++i) {
    const int64_t len = std::max<int64_t>(1, n - (i * 5) % std::max<int64_t>(1, n));
    std::vector<int32_t> p(base.begin(), base.begin() + len);
    if (i % 3 == 2) std::rotate(p.begin(), p.begin() + static_cast<int64_t>(p.size()) / 2, p.end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Greedy continuation of `prompt`, one sequence alone, `gen` tokens.
inline std::vector<int32_t> alone(ModelRunner& t, const std::vector<int32_t>& prompt, int gen) {
  KvCache kv = t.new_cache();
  std::vector<int32_t> out;
  int32_t token = t.forward_greedy(prompt.data(), static_cast<int64_t>(prompt.size()), kv);
  for (int i = 0; i < gen; ++i) {
    out.push_back(token);
    if (i + 1 < gen) token = t.forward_greedy(&token, 1, kv);
  }
  return out;
}

using test_support::TokenSink;

// All of `prompts` through the engine: three join before each step; prompts prefill
// `chunk` tokens per step in all, after the decodes; the prefix cache on.
inline std::vector<std::vector<int32_t>> batched(const Model& model, const std::vector<Backend*>& backends,
                                                 const std::vector<std::vector<int32_t>>& prompts, int gen,
                                                 int64_t chunk, const KvQuant& kv_quant = {},
                                                 const SpeculationOptions& speculation = {}) {
  EngineOptions options;
  options.kv_quant = kv_quant;
  options.speculation = speculation;
  options.batch = static_cast<int>(prompts.size());
  options.prefill_chunk = chunk;
  options.prompt_cache_bytes = size_t{1} << 30;
  options.kv_block_size = 4;  // small blocks: the shared prefixes are adopted
  EngineCore core(model, nullptr, backends, options);
  std::vector<std::shared_ptr<TokenSink>> sinks;
  for (size_t next = 0; next < prompts.size() || !core.idle();) {
    for (int joined = 0; joined < 3 && next < prompts.size(); ++joined, ++next) {
      GenerationRequest request;
      request.prompt = prompts[next];
      request.max_tokens = gen;
      request.ignore_eos = true;
      sinks.push_back(std::make_shared<TokenSink>());
      core.submit(std::move(request), sinks.back());
    }
    core.step();
  }
  std::vector<std::vector<int32_t>> out;
  for (const auto& sink : sinks) {
    EXPECT_TRUE(sink->end.ok()) << sink->end.error;
    out.push_back(sink->tokens);
  }
  if (speculation.on()) {
    EXPECT_GT(core.load().speculation.verifies, 0) << "nothing was drafted";
  }
  if (core.load().prefix_cache.capacity_bytes > 0 && prompts.size() > 1 && prompts.front().size() >= 9) {  // (off for length-dependent RoPE)
    EXPECT_GT(core.load().prefix_cache.hits, 0) << "no sequence adopted a cached prefix";
  }
  return out;
}

inline void expect_batched_equals_alone(const Model& model, const std::vector<Backend*>& batched_on, Backend& alone_on,
                                        const std::vector<int32_t>& base, const KvQuant& kv_quant = {}) {
  auto prompts = mixed_prompts(base, 10);
  // And a long one, last: while it prefills and decodes, the step's bound passes one chunk
  // of the decode attention, so the short decodes beside it take the chunk merge they do
  // not take alone.
  std::vector<int32_t> long_prompt;
  while (long_prompt.size() < 200) long_prompt.insert(long_prompt.end(), base.begin(), base.end());
  prompts.push_back(std::move(long_prompt));
  constexpr int kGen = 12;
  const auto together = batched(model, batched_on, prompts, kGen, 7, kv_quant);
  StandaloneRunner reference = make_standalone_runner(model, {&alone_on}, {}, kv_quant);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(together[i], alone(*reference, prompts[i], kGen)) << "sequence " << i << " (prompt of " << prompts[i].size() << ")";
}

// Speculation changes no token: each drafter (n-gram lookup; another golden model with the
// same vocabulary as the draft) through the engine, every prompt batched and each alone,
// against plain greedy decoding.
inline void expect_speculation_changes_no_token(Backend& backend, const std::string& name) {
  Golden g = read_golden(case_dir(name));
  Model model = load_model(model_dir(name));
  auto prompts = mixed_prompts(g.prompt, 5);
  std::vector<int32_t> repeated = g.prompt;  // prompt lookup finds its n-grams
  repeated.insert(repeated.end(), g.prompt.begin(), g.prompt.end());
  prompts.push_back(std::move(repeated));
  constexpr int kGen = 24;
  StandaloneRunner reference = make_standalone_runner(model, {&backend});
  std::vector<std::vector<int32_t>> plain;
  for (const auto& p : prompts) plain.push_back(alone(*reference, p, kGen));
  SpeculationOptions ngram, drafted;
  ngram.kind = DraftKind::kNgram;
  drafted.kind = DraftKind::kModel;
  // The draft: kettle-demo's own draft model, or another golden model (their vocabularies are all 512 ids).
  drafted.draft_model = name.find("kettle-demo") != std::string::npos ? model_dir("goldens-demo/kettle-demo-draft")
                        : name == "goldens/llama"                     ? model_dir("goldens/qwen2")
                                                                      : model_dir("goldens/llama");
  for (const SpeculationOptions& spec : {ngram, drafted}) {
    const auto together = batched(model, {&backend}, prompts, kGen, 7, {}, spec);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(together[i], plain[i]) << draft_kind_name(spec.kind) << ", batched: sequence " << i;
      EXPECT_EQ(batched(model, {&backend}, {prompts[i]}, kGen, 64, {}, spec)[0], plain[i])
          << draft_kind_name(spec.kind) << ", alone: sequence " << i;
    }
  }
}

// The golden case `name`'s model on `backend`: batching changes no token (KV rows stored as
// `kv_quant` says).
inline void expect_batching_changes_no_token(Backend& backend, const std::string& name, const KvQuant& kv_quant = {}) {
  Golden g = read_golden(case_dir(name));
  Model model = load_model(model_dir(name));
  expect_batched_equals_alone(model, {&backend}, backend, g.prompt, kv_quant);
}

}  // namespace kettle::golden
