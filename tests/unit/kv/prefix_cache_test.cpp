// PrefixCache on the CPU backend: block-aligned longest-prefix matching that
// always leaves a prompt token to run, the KV rows handed back intact, entries
// a longer sequence covers dropped, least-recently-used eviction under the cap.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/backend.h"
#include "kv/prefix_cache.h"

namespace kettle {
namespace {

constexpr int64_t kLayers = 2, kKvSize = 4, kBlock = 4;

// A cache holding `tokens`, each row filled with its token id (so rows can be checked later).
KvCache filled(Backend& backend, const std::vector<int32_t>& tokens) {
  KvCache kv(backend, kLayers, kKvSize);
  kv.reserve(static_cast<int64_t>(tokens.size()));
  for (int64_t layer = 0; layer < kLayers; ++layer)
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int64_t c = 0; c < kKvSize; ++c) {
        kv.keys(layer)[t * kKvSize + c] = static_cast<float>(tokens[t]);
        kv.values(layer)[t * kKvSize + c] = -static_cast<float>(tokens[t]);
      }
  kv.set_length(static_cast<int64_t>(tokens.size()));
  return kv;
}

std::vector<int32_t> range(int32_t first, int32_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixCache, LongestBlockAlignedPrefixLeavesATokenToRun) {
  auto backend = make_cpu_backend(1);
  PrefixCache cache(1 << 20, kBlock);
  std::vector<int32_t> first = range(100, 11);  // 11 tokens: blocks [0,4) [4,8)
  cache.put(first, filled(*backend, first));
  std::vector<int32_t> prompt = range(100, 10);
  prompt.push_back(7);  // shares 10 tokens: 8 usable
  auto lease = cache.take(prompt);
  ASSERT_TRUE(lease);
  EXPECT_EQ(lease->cached_tokens, 8);
  EXPECT_EQ(lease->kv.length(), 8);
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(lease->kv.keys(1)[t * kKvSize], static_cast<float>(100 + t));
    EXPECT_EQ(lease->kv.values(0)[t * kKvSize + 3], -static_cast<float>(100 + t));
  }
  EXPECT_FALSE(cache.take(prompt)) << "a lent entry is out of the cache";
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.lookups, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.cached_tokens, 8);
}

TEST(PrefixCache, TheWholePromptCachedStillRunsItsLastBlockPart) {
  auto backend = make_cpu_backend(1);
  PrefixCache cache(1 << 20, kBlock);
  std::vector<int32_t> tokens = range(0, 12);
  cache.put(tokens, filled(*backend, tokens));
  auto lease = cache.take(range(0, 8));  // identical to a cached prefix of 8: 7 usable → 4
  ASSERT_TRUE(lease);
  EXPECT_EQ(lease->cached_tokens, 4);
}

TEST(PrefixCache, NoWholeBlockNoHit) {
  auto backend = make_cpu_backend(1);
  PrefixCache cache(1 << 20, kBlock);
  std::vector<int32_t> tokens = range(0, 8);
  cache.put(tokens, filled(*backend, tokens));
  std::vector<int32_t> prompt = {0, 1, 2, 9, 9, 9, 9, 9};
  EXPECT_FALSE(cache.take(prompt));
  EXPECT_EQ(cache.stats().entries, 1);
}

TEST(PrefixCache, ALongerSequenceReplacesItsPrefixes) {
  auto backend = make_cpu_backend(1);
  PrefixCache cache(1 << 20, kBlock);
  cache.put(range(0, 8), filled(*backend, range(0, 8)));
  cache.put(range(50, 8), filled(*backend, range(50, 8)));
  cache.put(range(0, 16), filled(*backend, range(0, 16)));
  EXPECT_EQ(cache.stats().entries, 2);
  auto lease = cache.take(range(0, 20));
  ASSERT_TRUE(lease);
  EXPECT_EQ(lease->cached_tokens, 16);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedPastTheCap) {
  auto backend = make_cpu_backend(1);
  // one entry of 256 rows (KvCache's minimum capacity) = 256 * 4 * 4 B * 2 (k, v) * 2 layers = 16 KiB
  const size_t entry = 256 * kKvSize * sizeof(float) * 2 * kLayers;
  PrefixCache cache(2 * entry, kBlock);
  cache.put(range(0, 8), filled(*backend, range(0, 8)));
  cache.put(range(100, 8), filled(*backend, range(100, 8)));
  EXPECT_EQ(cache.stats().bytes, 2 * entry);
  cache.put(range(200, 8), filled(*backend, range(200, 8)));  // evicts range(0, 8), the oldest
  EXPECT_EQ(cache.stats().entries, 2);
  EXPECT_FALSE(cache.take(range(0, 9)));
  EXPECT_TRUE(cache.take(range(100, 9)));
  PrefixCache off(0, kBlock);
  off.put(range(0, 8), filled(*backend, range(0, 8)));
  EXPECT_EQ(off.stats().entries, 0);
}

}  // namespace
}  // namespace kettle
