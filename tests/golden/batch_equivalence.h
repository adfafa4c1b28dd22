// Continuous batching must not change a token: sequences of mixed lengths, some
// sharing a prefix, join a running batch in waves, prefill in small chunks beside
// the running decodes (as the server's engine steps them), and decode greedily
// with the token drawn where the logits live — and each must produce exactly the
// tokens it produces alone. Used by the CPU and the CUDA golden tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "golden/golden_cases.h"
#include "model/model.h"
#include "model/transformer.h"

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

// All of `prompts` through continuous batching: sequence i joins at step i / 3; prompts
// prefill `chunk` tokens per step in all, after the decodes.
inline std::vector<std::vector<int32_t>> batched(ModelRunner& t, const std::vector<std::vector<int32_t>>& prompts, int gen,
                                                 int64_t chunk) {
  const size_t count = prompts.size();
  std::vector<KvCache> caches;
  for (size_t i = 0; i < count; ++i) caches.push_back(t.new_cache());
  std::vector<std::vector<int32_t>> out(count);
  std::vector<int64_t> prefilled(count, 0);
  std::vector<int32_t> next(count, 0);
  for (int step = 0;; ++step) {
    std::vector<BatchEntry> entries;
    std::vector<size_t> who;
    for (size_t i = 0; i < count; ++i)  // decodes first
      if (static_cast<int>(i) / 3 <= step && prefilled[i] == static_cast<int64_t>(prompts[i].size()) &&
          static_cast<int>(out[i].size()) < gen) {
        entries.push_back({&next[i], 1, &caches[i], true});
        who.push_back(i);
      }
    int64_t budget = chunk;
    for (size_t i = 0; i < count && budget > 0; ++i) {
      const auto len = static_cast<int64_t>(prompts[i].size());
      if (static_cast<int>(i) / 3 > step || prefilled[i] == len) continue;
      const int64_t n = std::min(budget, len - prefilled[i]);
      entries.push_back({prompts[i].data() + prefilled[i], n, &caches[i]});
      who.push_back(i);
      prefilled[i] += n;
      budget -= n;
    }
    if (entries.empty()) {
      if (std::all_of(out.begin(), out.end(), [&](const auto& o) { return static_cast<int>(o.size()) == gen; })) break;
      continue;  // waiting for the next wave
    }
    std::vector<SampleRow> greedy(entries.size());
    std::vector<int32_t> ids(entries.size());
    t.forward_batch(entries, greedy.data(), ids.data());
    for (size_t e = 0; e < who.size(); ++e) {
      const size_t i = who[e];
      if (prefilled[i] < static_cast<int64_t>(prompts[i].size())) continue;  // mid-prompt: logits unused
      out[i].push_back(ids[e]);
      next[i] = ids[e];
    }
  }
  return out;
}

inline void expect_batched_equals_alone(ModelRunner& t, const std::vector<int32_t>& base) {
  const auto prompts = mixed_prompts(base, 10);
  constexpr int kGen = 12;
  const auto together = batched(t, prompts, kGen, 7);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(together[i], alone(t, prompts[i], kGen)) << "sequence " << i << " (prompt of " << prompts[i].size() << ")";
}

// The golden case `name`'s model on `backend`: batching changes no token.
inline void expect_batching_changes_no_token(Backend& backend, const std::string& name) {
  Golden g = read_golden(case_dir(name));
  Model model = load_model(model_dir(name));
  Transformer transformer(model, backend, KvPool::Options{16, 0});
  expect_batched_equals_alone(transformer, g.prompt);
}

}  // namespace kettle::golden
