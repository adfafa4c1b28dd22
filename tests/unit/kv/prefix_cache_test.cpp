// The paged KV pool and the token-block prefix tree on the CPU backend:
// block-aligned longest-prefix matching that always leaves a prompt token to
// run, blocks shared (not moved) between the tree and any number of
// sequences, reference counts back to zero, LRU eviction under the cap and on
// the pool's demand, sliding-window blocks let go and matches that respect them.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "kv/prefix_cache.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"
#include "kv/kv_quant.h"
#include "util/error.h"

namespace kettle {
namespace {

constexpr int kBlock = 4;
constexpr int64_t kKvSize = 4;

// Layers with these sliding windows (0: full attention), one KV head of kKvSize, f32 (the CPU's).
KvLayout layout_with(std::vector<int> windows) {
  KvLayout layout;
  layout.kv_heads = 1;
  layout.head_dim = kKvSize;
  for (int w : windows) layout.layers.push_back(w > 0 ? KvLayer{KvLayer::Kind::kWindow, w, {}} : KvLayer{});
  return layout;
}

std::vector<int32_t> range(int32_t first, int32_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A sequence of `tokens` whose rows hold their token ids (keys) and minus them (values).
KvCache filled(KvPool& pool, const std::vector<int32_t>& tokens) {
  KvCache kv(pool);
  kv.reserve(static_cast<int64_t>(tokens.size()));
  for (int64_t layer = 0; layer < 2; ++layer) {
    const std::vector<int32_t>& table = kv.table(pool.kind_of(layer));
    for (size_t t = 0; t < tokens.size(); ++t) {
      const int64_t row = table[t / kBlock] * int64_t{kBlock} + static_cast<int64_t>(t % kBlock);
      for (int64_t c = 0; c < kKvSize; ++c) {
        static_cast<float*>(pool.keys(layer))[row * kKvSize + c] = static_cast<float>(tokens[t]);  // CPU: f32
        static_cast<float*>(pool.values(layer))[row * kKvSize + c] = -static_cast<float>(tokens[t]);
      }
    }
  }
  kv.set_length(static_cast<int64_t>(tokens.size()));
  return kv;
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
  KvLayout layout_ = layout_with({0, 0});
  KvPool pool_{layout_, *backend_, KvPool::Options{kBlock, 0}};
};

TEST_F(PrefixCacheTest, LongestBlockAlignedPrefixIsSharedNotMoved) {
  PrefixCache cache(pool_, 1 << 20);
  std::vector<int32_t> first = range(100, 11);  // blocks [0,4) [4,8) and a partial one
  KvCache seq = filled(pool_, first);
  cache.insert(first, seq);
  std::vector<int32_t> prompt = range(100, 10);
  prompt.push_back(7);  // shares 10 tokens: 8 usable
  for (int twice = 0; twice < 2; ++twice) {  // a match lends, the tree keeps its blocks
    PrefixCache::Match hit = cache.match(prompt);
    ASSERT_EQ(hit.tokens, 8);
    ASSERT_EQ(hit.blocks[KvPool::kFull].size(), 2u);
    EXPECT_EQ(hit.blocks[KvPool::kFull][0], seq.table(KvPool::kFull)[0]);
    EXPECT_EQ(hit.blocks[KvPool::kFull][1], seq.table(KvPool::kFull)[1]);
    KvCache lent(pool_);
    lent.adopt(hit.blocks, hit.tokens);
    EXPECT_EQ(lent.length(), 8);
    const int32_t b1 = lent.table(KvPool::kFull)[1];
    EXPECT_EQ(static_cast<const float*>(pool_.keys(1))[(b1 * kBlock + 3) * kKvSize], 107.0f);  // token 7 of the prefix
    EXPECT_EQ(pool_.references(KvPool::kFull, b1), 3);                // seq, the tree, lent
  }
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.lookups, 2);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.cached_tokens, 16);
  EXPECT_EQ(s.entries, 2);
}

TEST_F(PrefixCacheTest, TheWholePromptCachedStillRunsItsLastBlockPart) {
  PrefixCache cache(pool_, 1 << 20);
  std::vector<int32_t> tokens = range(0, 12);
  KvCache seq = filled(pool_, tokens);
  cache.insert(tokens, seq);
  EXPECT_EQ(cache.match(range(0, 8)).tokens, 4);  // 7 usable → one block
  EXPECT_EQ(cache.match(range(0, 13)).tokens, 12);
}

TEST_F(PrefixCacheTest, ScopesShareNothingAndEmptyScopesAreDropped) {
  PrefixCache cache(pool_, 1 << 20);
  std::vector<int32_t> tokens = range(0, 12);
  KvCache seq = filled(pool_, tokens);
  cache.insert(tokens, seq, 7);
  EXPECT_EQ(cache.match(range(0, 13)).tokens, 0);     // the default scope sees nothing
  EXPECT_EQ(cache.match(range(0, 13), 8).tokens, 0);  // nor does another
  EXPECT_EQ(cache.match(range(0, 13), 7).tokens, 12);
  cache.insert(tokens, seq);  // the same tokens in the default scope: their own nodes
  EXPECT_EQ(cache.stats().entries, 6);
  EXPECT_EQ(cache.match(range(0, 13)).tokens, 12);
  EXPECT_EQ(cache.clear(), 6);
  EXPECT_EQ(cache.match(range(0, 13), 7).tokens, 0);
  const int32_t b0 = seq.table(KvPool::kFull)[0];
  EXPECT_EQ(pool_.references(KvPool::kFull, b0), 1);  // only the sequence holds it again
}

TEST_F(PrefixCacheTest, NoWholeBlockNoHit) {
  PrefixCache cache(pool_, 1 << 20);
  KvCache seq = filled(pool_, range(0, 8));
  cache.insert(range(0, 8), seq);
  EXPECT_EQ(cache.match(std::vector<int32_t>{0, 1, 2, 9, 9, 9, 9, 9}).tokens, 0);
  EXPECT_EQ(cache.stats().hits, 0);
}

TEST_F(PrefixCacheTest, SequencesSharingABlockShareANode) {
  PrefixCache cache(pool_, 1 << 20);
  std::vector<int32_t> a = range(0, 8), b = range(0, 4);
  b.insert(b.end(), {50, 51, 52, 53});
  KvCache sa = filled(pool_, a), sb = filled(pool_, b);
  cache.insert(a, sa);
  cache.insert(b, sb);
  EXPECT_EQ(cache.stats().entries, 3);  // [0..3], then [4..7] and [50..53] beside each other
  std::vector<int32_t> prompt = b;
  prompt.push_back(1);
  PrefixCache::Match hit = cache.match(prompt);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.blocks[KvPool::kFull][0], sa.table(KvPool::kFull)[0]) << "the first block kept is the first inserted";
  EXPECT_EQ(hit.blocks[KvPool::kFull][1], sb.table(KvPool::kFull)[1]);
}

TEST_F(PrefixCacheTest, EveryReferenceComesBack) {
  {
    PrefixCache cache(pool_, 1 << 20);
    KvCache seq = filled(pool_, range(0, 10));
    cache.insert(range(0, 10), seq);
    EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 3);
    seq.clear();
    EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 2) << "the partial block was the sequence's alone";
    EXPECT_EQ(cache.clear(), 2);
    EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 0);
  }
  EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 0);
}

TEST_F(PrefixCacheTest, EvictsLeastRecentlyUsedPastTheCap) {
  const size_t block = pool_.bytes_per_block(KvPool::kFull);  // 2 layers × 4 rows × 4 floats × 2
  EXPECT_EQ(block, 2u * kBlock * kKvSize * sizeof(float) * 2);
  PrefixCache cache(pool_, 4 * block);
  for (int32_t first : {0, 100}) {
    KvCache seq = filled(pool_, range(first, 8));
    cache.insert(range(first, 8), seq);
  }
  EXPECT_EQ(cache.stats().bytes, 4 * block);
  EXPECT_EQ(cache.match(range(0, 9)).tokens, 8);  // range(0, ...) is now the most recent
  KvCache third = filled(pool_, range(200, 4));
  cache.insert(range(200, 4), third);  // evicts range(100, 8)'s leaf
  EXPECT_EQ(cache.stats().entries, 4);
  EXPECT_EQ(cache.match(range(100, 9)).tokens, 4);
  EXPECT_EQ(cache.match(range(0, 9)).tokens, 8);
  PrefixCache off(pool_, 0);
  off.insert(range(0, 8), third);
  EXPECT_EQ(off.stats().entries, 0);
}

TEST_F(PrefixCacheTest, AFullPoolTakesBlocksBackFromTheTree) {
  KvPool pool(layout_, *backend_, KvPool::Options{kBlock, 20 * pool_.bytes_per_block(KvPool::kFull)});
  PrefixCache cache(pool, 1 << 20);
  pool.set_reclaimer([&] { return cache.evict_one(); });
  {
    KvCache seq = filled(pool, range(0, 64));  // 16 blocks
    cache.insert(range(0, 64), seq);
  }
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 16);
  KvCache big(pool);
  big.reserve(12 * kBlock);  // 12 more: the pool holds 20 (block 0, the padding block, besides)
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 20);
  EXPECT_EQ(cache.stats().entries, 8) << "the least recently used leaves went first";
  EXPECT_EQ(cache.match(range(0, 100)).tokens, 32);
  KvCache more(pool);
  EXPECT_THROW(more.reserve(21 * kBlock), Error);
}

// The pool's reclaimer must only take what evicting frees: a tree whose every block a
// running sequence also holds has nothing to give, and keeps its entries.
TEST_F(PrefixCacheTest, EvictionNeverDropsWhatARunningSequenceHolds) {
  KvPool pool(layout_, *backend_, KvPool::Options{kBlock, 8 * pool_.bytes_per_block(KvPool::kFull)});
  PrefixCache cache(pool, 1 << 20);
  pool.set_reclaimer([&] { return cache.evict_one(); });
  KvCache running = filled(pool, range(0, 32));  // 8 blocks: the pool is full
  PrefixCache::Hold hold;                        // the running sequence's
  cache.insert(range(0, 32), running, 0, hold);
  KvCache next(pool);
  EXPECT_THROW(next.reserve(kBlock), Error) << "nothing can be freed";
  EXPECT_EQ(cache.stats().entries, 8) << "evicting blocks a sequence holds frees nothing: the tree keeps them";
  EXPECT_EQ(cache.match(range(0, 33)).tokens, 32);
  EXPECT_EQ(cache.clear(), 0) << "a flush drops only what nobody holds";
  hold.release();
  running.clear();  // the sequence ends: its blocks are the tree's alone, and can go
  next.reserve(2 * kBlock);
  EXPECT_EQ(cache.stats().entries, 6) << "the least recently used leaves went first";
  EXPECT_EQ(cache.match(range(0, 33)).tokens, 24);
}

// --prompt-cache counts what the cache alone keeps: a running sequence's shared blocks are
// not charged (nor evicted) until it ends; then the cap holds.
TEST_F(PrefixCacheTest, TheCapCountsOnlyBlocksTheCacheAloneKeeps) {
  const size_t block = pool_.bytes_per_block(KvPool::kFull);
  PrefixCache cache(pool_, 2 * block);
  KvCache running = filled(pool_, range(0, 16));  // 4 blocks
  {
    PrefixCache::Hold hold;
    cache.insert(range(0, 16), running, 0, hold);
    EXPECT_EQ(cache.stats().entries, 4);
    EXPECT_EQ(cache.stats().held_bytes, 4 * block);
    PrefixCache::Match shared = cache.match(range(0, 9));  // a second sequence holds the first two blocks
    EXPECT_EQ(shared.tokens, 8);
    hold.release();  // the first ends: blocks 2 and 3 are the cache's alone, over the cap with nothing else
    EXPECT_EQ(cache.stats().entries, 4);
    EXPECT_EQ(cache.stats().bytes - cache.stats().held_bytes, 2 * block);
  }  // the second ends: four blocks of the cache's own, two too many
  EXPECT_EQ(cache.stats().entries, 2);
  EXPECT_EQ(cache.stats().held_bytes, 0u);
  EXPECT_EQ(cache.match(range(0, 17)).tokens, 8);
}

// A block leaves the pool as one byte string across its layers and comes back into another.
TEST_F(PrefixCacheTest, ABlockIsReadAndWrittenAcrossItsLayersAsAUnit) {
  KvCache a = filled(pool_, range(40, 8));
  const int32_t from = a.table(KvPool::kFull)[1];
  const std::vector<unsigned char> bytes = pool_.read_block(KvPool::kFull, from);
  ASSERT_EQ(bytes.size(), pool_.bytes_per_block(KvPool::kFull));
  KvCache b(pool_);
  b.reserve(kBlock);
  const int32_t to = b.table(KvPool::kFull)[0];
  ASSERT_NE(to, from);
  pool_.write_block(KvPool::kFull, to, bytes);
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t c = 0; c < kBlock * kKvSize; ++c) {
      EXPECT_EQ(static_cast<float*>(pool_.keys(layer))[to * kBlock * kKvSize + c], 44 + c / kKvSize);
      EXPECT_EQ(static_cast<float*>(pool_.values(layer))[to * kBlock * kKvSize + c], -(44 + c / kKvSize));
    }
  EXPECT_THROW(pool_.write_block(KvPool::kFull, to, std::vector<unsigned char>(3)), Error);
}

TEST(KvPool, SlidingWindowBlocksAreLetGoAndMatchesRespectThem) {
  auto backend = make_cpu_backend(1);
  KvLayout layout = layout_with({0, 6});  // layer 1 sees the last 6 positions
  KvPool pool(layout, *backend, KvPool::Options{kBlock, 0});
  EXPECT_EQ(pool.kind_of(1), KvPool::kWindow);
  EXPECT_EQ(pool.window(), 6);
  PrefixCache cache(pool, 1 << 20);
  KvCache seq(pool);
  seq.reserve(8);
  seq.set_length(8);
  cache.insert(range(0, 8), seq);  // both blocks of both kinds
  seq.reserve(24);
  seq.set_length(24);  // a query at 24 sees from 19: window blocks 0..3 are let go
  EXPECT_EQ(seq.table(KvPool::kWindow)[3], 0);
  EXPECT_NE(seq.table(KvPool::kWindow)[4], 0);
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 6);
  EXPECT_EQ(pool.used_blocks(KvPool::kWindow), 2 + 2);  // blocks 4, 5 and the tree's two
  cache.insert(range(0, 24), seq);  // blocks 2..5: windows of 2 and 3 gone
  // A continuation at 24 needs window blocks from 19 (block 4); at 16 from 11 (block 2, gone);
  // at 8 from 3 (blocks 0, 1: the tree holds them).
  EXPECT_EQ(cache.match(range(0, 25)).tokens, 24);
  std::vector<int32_t> prompt = range(0, 16);
  prompt.push_back(99);
  EXPECT_EQ(cache.match(prompt).tokens, 8);
}

// Under a cap, a model with both kinds gives the window kind a fixed share (enough for
// max_sequences windows plus a step each); admission counts the full kind against the rest.
TEST(KvPool, TheWindowKindsShareAndAdmissionUnderACap) {
  auto backend = make_cpu_backend(1);
  KvLayout layout = layout_with({0, 6});
  const size_t block = KvPool(layout, *backend, KvPool::Options{kBlock, 0}).bytes_per_block(KvPool::kFull);  // 1 layer × 4 rows × 4 floats × 2
  EXPECT_EQ(block, 128u);
  KvPool pool(layout, *backend, KvPool::Options{kBlock, 20 * block, 2, 4});
  // A window sequence holds (6 + 4 + 3) / 4 + 1 = 4 blocks at most: 8 for two; the full kind gets 12.
  EXPECT_EQ(pool.available_blocks(KvPool::kWindow), 8);
  EXPECT_EQ(pool.available_blocks(KvPool::kFull), 12);
  EXPECT_EQ(pool.admission_capacity(), 12 * block);
  EXPECT_EQ(pool.admission_bytes(10), 3 * block);
  KvPool windowed(layout_with({6, 6}), *backend, KvPool::Options{kBlock, 20 * block, 2, 4});
  EXPECT_EQ(windowed.admission_bytes(1000), 4 * windowed.bytes_per_block(KvPool::kWindow)) << "a window holds its blocks only";
  KvPool open(layout, *backend, KvPool::Options{kBlock, 0});
  EXPECT_EQ(open.admission_capacity(), 0u) << "no cap";
}

// Layers of different codecs (turbo: keys affine 8-bit, values Lloyd-Max 3-bit on full layers;
// the window layer plain): each layer's blocks sized by its own rows, a block moved whole.
TEST(KvPool, QuantizedLayersSizeTheirBlocksByTheirCodecs) {
  auto backend = make_cpu_backend(1);
  KvLayout layout;
  layout.kv_heads = 2;
  layout.head_dim = 64;
  const KvQuant turbo = parse_kv_quant("turbo");
  for (int w : {0, 8, 0}) {
    KvLayer layer = w > 0 ? KvLayer{KvLayer::Kind::kWindow, w, {}} : KvLayer{};
    layer.codec = turbo.codec_for(static_cast<int64_t>(layout.layers.size()), layer.kind, 64, DType::kF32);
    layout.layers.push_back(layer);
  }
  KvPool pool(layout, *backend, KvPool::Options{kBlock, 0});
  // A full layer's row: keys 128 codes + 4 groups of (f16 scale, f16 bias); values 48 bytes of
  // 3-bit codes + 4 groups of an f16 RMS. The window layer: two f32 rows of 128.
  EXPECT_EQ(layout.key_row_bytes(0), 128u + 4 * 4);
  EXPECT_EQ(layout.value_row_bytes(0), 48u + 4 * 2);
  EXPECT_EQ(pool.bytes_per_block(KvPool::kFull), 2u * kBlock * (144 + 56));
  EXPECT_EQ(pool.bytes_per_block(KvPool::kWindow), size_t{kBlock} * 2 * 128 * 4);
  const int32_t a = pool.allocate(KvPool::kFull), b = pool.allocate(KvPool::kFull);
  std::vector<unsigned char> bytes(pool.bytes_per_block(KvPool::kFull));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  pool.write_block(KvPool::kFull, a, bytes);
  EXPECT_EQ(pool.read_block(KvPool::kFull, a), bytes);
  EXPECT_EQ(pool.read_block(KvPool::kFull, b), std::vector<unsigned char>(bytes.size(), 0)) << "a fresh block is zeros";
  // Layer 2's values: the last bytes of the block's string.
  const size_t value_block = kBlock * layout.value_row_bytes(2);
  EXPECT_EQ(std::memcmp(static_cast<unsigned char*>(pool.values(2)) + a * value_block,
                        bytes.data() + bytes.size() - value_block, value_block), 0);
}

}  // namespace
}  // namespace kettle
