// The paged KV pool and the token-block prefix tree on the CPU backend:
// block-aligned longest-prefix matching that always leaves a prompt token to
// run, blocks shared (not moved) between the tree and any number of
// sequences, reference counts back to zero, LRU eviction under the cap and on
// the pool's demand, sliding-window blocks let go and matches that respect them;
// with a disk tier, blocks leaving memory (evicted, written behind, demoted)
// reach the disk and come back into a fresh process's pool byte for byte.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "backend/backend.h"
#include "kv/prefix_cache.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"
#include "kv/kv_quant.h"
#include "kv/ssd_tier.h"
#include "util/error.h"
#include "support/temp_dir.h"

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

// ---- the disk tier -------------------------------------------------------


constexpr auto kPatience = std::chrono::seconds(10);

SsdOptions ssd_options(const std::filesystem::path& dir) {
  SsdOptions o;
  o.dir = dir;
  o.verify = true;
  return o;
}

const SsdIdentity kIdentity = {"test/model", "weights", "tokenizer", "plain layers=2 heads=1x4 block=4"};

bool written(SsdTier& tier) {
  return tier.wait_written(std::chrono::steady_clock::now() + kPatience);
}

// The entries of one restore (bounded wait for the scan, then for the read).
std::vector<SsdEntry> read_back(SsdTier& tier, std::vector<Sha256Digest> digests) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (tier.stats().scanning && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t ticket = tier.restore(std::move(digests));
  while (std::chrono::steady_clock::now() < deadline) {
    for (SsdTier::Restored& r : tier.take_restored())
      if (r.ticket == ticket) return std::move(r.entries);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "no restore within " << kPatience.count() << " s";
  return {};
}

// The blocks `m` adopted hold the rows filled() wrote for `tokens`: keys the token ids,
// values minus them, in every layer.
void expect_rows_of(KvPool& pool, const PrefixCache::Match& m, const std::vector<int32_t>& tokens) {
  for (size_t t = 0; t < static_cast<size_t>(m.tokens); ++t) {
    const int64_t row = m.blocks[KvPool::kFull][t / kBlock] * int64_t{kBlock} + static_cast<int64_t>(t % kBlock);
    for (int64_t layer = 0; layer < 2; ++layer)
      for (int64_t c = 0; c < kKvSize; ++c) {
        ASSERT_EQ(static_cast<const float*>(pool.keys(layer))[row * kKvSize + c], static_cast<float>(tokens[t])) << t;
        ASSERT_EQ(static_cast<const float*>(pool.values(layer))[row * kKvSize + c], -static_cast<float>(tokens[t]))
            << t;
      }
  }
}

// Evicted blocks are written to disk; a fresh process (pool, tier, cache) finds them by
// the prompt's digests, reads them back and puts them in its tree: the next match adopts
// them, holding the same bytes as the blocks that left.
TEST_F(PrefixCacheTest, EvictedBlocksComeBackIntoAFreshProcess) {
  TempDir dir("kettle_prefix_ssd");
  const uint64_t scope = 42;
  const std::vector<int32_t> tokens = range(500, 12);  // three blocks
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(9);
  std::vector<std::vector<unsigned char>> originals;
  {
    SsdTier tier(ssd_options(dir.path()), kIdentity);
    PrefixCache cache(pool_, 1 << 20);
    cache.set_disk_tier(&tier);
    KvCache seq = filled(pool_, tokens);
    cache.insert(tokens, seq, scope);
    for (int b = 0; b < 3; ++b) originals.push_back(pool_.read_block(KvPool::kFull, seq.table(KvPool::kFull)[b]));
    seq.clear();
    EXPECT_EQ(cache.not_on_disk(), 3);
    EXPECT_TRUE(cache.evict_one());
    EXPECT_EQ(cache.clear(), 2);
    ASSERT_TRUE(written(tier));
    EXPECT_EQ(tier.stats().written, 3);
    EXPECT_EQ(tier.stats().entries, 3);
    EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 0) << "the pool's blocks are free once on their way to disk";
  }
  auto backend = make_cpu_backend(1);
  KvPool pool(layout_, *backend, KvPool::Options{kBlock, 0});
  SsdTier tier(ssd_options(dir.path()), kIdentity);
  PrefixCache cache(pool, 1 << 20);
  cache.set_disk_tier(&tier);
  const std::vector<Sha256Digest> digests = cache.digests(prompt, scope);
  ASSERT_EQ(digests.size(), 3u);
  EXPECT_EQ(cache.digests(tokens, scope).size(), 2u) << "a match leaves one prompt token to run";
  EXPECT_EQ(cache.blocks_in_memory(prompt, scope), 0u);
  const std::vector<SsdEntry> entries = read_back(tier, digests);
  EXPECT_EQ(tier.on_disk(digests), 3u);
  EXPECT_EQ(tier.on_disk(cache.digests(prompt, scope + 1)), 0u) << "another scope names other blocks";
  ASSERT_EQ(entries.size(), 3u);
  cache.restore(prompt, scope, 0, entries);
  EXPECT_EQ(cache.blocks_in_memory(prompt, scope), 3u);
  EXPECT_EQ(cache.stats().entries, 3);
  EXPECT_EQ(cache.not_on_disk(), 0) << "restored blocks are on disk already";
  EXPECT_EQ(cache.match(prompt, scope + 1).tokens, 0);
  {
    PrefixCache::Match m = cache.match(prompt, scope);
    ASSERT_EQ(m.tokens, 12);
    for (size_t b = 0; b < 3; ++b)
      EXPECT_EQ(pool.read_block(KvPool::kFull, m.blocks[KvPool::kFull][b]), originals[b]) << b;
    expect_rows_of(pool, m, tokens);
  }
  EXPECT_EQ(cache.clear(), 3);
  ASSERT_TRUE(written(tier));
  EXPECT_EQ(tier.stats().written, 0) << "a block read from disk is not written again";
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 0);
}

// The engine's usual case: a prompt's first blocks are still in memory, the rest on disk.
// Blocks whose path left memory meanwhile are not restored (and nothing leaks).
TEST_F(PrefixCacheTest, ThePromptsLaterBlocksAreRestoredBehindItsCachedOnes) {
  TempDir dir("kettle_prefix_ssd");
  SsdTier tier(ssd_options(dir.path()), kIdentity);
  PrefixCache cache(pool_, 1 << 20);
  cache.set_disk_tier(&tier);
  const std::vector<int32_t> tokens = range(0, 16);
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(-1);
  std::vector<std::vector<unsigned char>> originals;
  {
    KvCache seq = filled(pool_, tokens);
    cache.insert(tokens, seq);
    for (int b = 0; b < 4; ++b) originals.push_back(pool_.read_block(KvPool::kFull, seq.table(KvPool::kFull)[b]));
  }
  EXPECT_TRUE(cache.evict_one());
  EXPECT_TRUE(cache.evict_one());
  EXPECT_EQ(cache.blocks_in_memory(prompt, 0), 2u);
  ASSERT_TRUE(written(tier));
  const std::vector<Sha256Digest> digests = cache.digests(prompt, 0);
  ASSERT_EQ(digests.size(), 4u);
  EXPECT_EQ(tier.on_disk(digests), 0u) << "the first blocks never left memory";
  const std::vector<Sha256Digest> later(digests.begin() + 2, digests.end());
  EXPECT_EQ(tier.on_disk(later), 2u);
  const std::vector<SsdEntry> entries = read_back(tier, later);
  ASSERT_EQ(entries.size(), 2u);
  cache.restore(prompt, 0, 2, entries);
  EXPECT_EQ(cache.blocks_in_memory(prompt, 0), 4u);
  {
    PrefixCache::Match m = cache.match(prompt);
    ASSERT_EQ(m.tokens, 16);
    for (size_t b = 0; b < 4; ++b) EXPECT_EQ(pool_.read_block(KvPool::kFull, m.blocks[KvPool::kFull][b]), originals[b]);
    expect_rows_of(pool_, m, tokens);
  }
  // Restored again after the whole path left memory: the path to them is gone, nothing is put in.
  EXPECT_EQ(cache.clear(), 4);
  ASSERT_TRUE(written(tier));
  cache.restore(prompt, 0, 2, entries);
  EXPECT_EQ(cache.blocks_in_memory(prompt, 0), 0u);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 0);
  // From the first block, all of it comes back (the first two were written by the clear).
  const std::vector<SsdEntry> all = read_back(tier, digests);
  ASSERT_EQ(all.size(), 4u);
  cache.restore(prompt, 0, 0, all);
  EXPECT_EQ(cache.match(prompt).tokens, 16);
}

// A pool whose blocks are all held takes what fits and no more: no throw, no leak.
TEST_F(PrefixCacheTest, ARestoreIntoAFullPoolTakesWhatFits) {
  TempDir dir("kettle_prefix_ssd");
  const std::vector<int32_t> tokens = range(0, 12);
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(-1);
  SsdTier tier(ssd_options(dir.path()), kIdentity);
  {
    PrefixCache cache(pool_, 1 << 20);
    cache.set_disk_tier(&tier);
    KvCache seq = filled(pool_, tokens);
    cache.insert(tokens, seq);
    EXPECT_EQ(cache.write_behind(), 3);
    ASSERT_TRUE(written(tier));
  }
  KvPool pool(layout_, *backend_, KvPool::Options{kBlock, 4 * pool_.bytes_per_block(KvPool::kFull)});
  PrefixCache cache(pool, 1 << 20);
  cache.set_disk_tier(&tier);
  pool.set_reclaimer([&] { return cache.evict_one(); });
  KvCache running(pool);
  running.reserve(3 * kBlock);  // 3 of the pool's 4 blocks
  const std::vector<SsdEntry> entries = read_back(tier, cache.digests(prompt, 0));
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_NO_THROW(cache.restore(prompt, 0, 0, entries));
  EXPECT_EQ(cache.blocks_in_memory(prompt, 0), 1u);
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 4);
  running.clear();
  EXPECT_EQ(cache.clear(), 1);
  EXPECT_EQ(pool.used_blocks(KvPool::kFull), 0);
}

// Written behind while idle: every block the tree holds goes to the tier once, parents
// first; afterwards evicting them writes nothing more.
TEST_F(PrefixCacheTest, WriteBehindHandsTheTierEveryUnsavedBlockOnce) {
  TempDir dir("kettle_prefix_ssd");
  SsdTier tier(ssd_options(dir.path()), kIdentity);
  PrefixCache cache(pool_, 1 << 20);
  std::vector<int32_t> a = range(0, 12), b = range(0, 4);
  b.insert(b.end(), {70, 71, 72, 73});
  KvCache sa = filled(pool_, a), sb = filled(pool_, b);
  cache.insert(a, sa);
  cache.insert(b, sb, 0);
  cache.insert(a, sa, 5);  // another scope: its own blocks
  ASSERT_EQ(cache.stats().entries, 7);
  EXPECT_EQ(cache.write_behind(), 0) << "no tier";
  EXPECT_EQ(cache.not_on_disk(), 7);
  cache.set_disk_tier(&tier);
  EXPECT_EQ(cache.not_on_disk(), 7);
  EXPECT_EQ(cache.write_behind(), 7);
  ASSERT_TRUE(written(tier));
  EXPECT_EQ(cache.not_on_disk(), 0);
  EXPECT_EQ(tier.stats().written, 7);
  EXPECT_EQ(cache.write_behind(), 0) << "each block once";
  for (const auto& [prompt, scope] :
       {std::pair{a, uint64_t{0}}, std::pair{b, uint64_t{0}}, std::pair{a, uint64_t{5}}}) {
    std::vector<int32_t> p = prompt;
    p.push_back(-1);
    const std::vector<Sha256Digest> d = cache.digests(p, scope);
    EXPECT_EQ(tier.on_disk(d), d.size());
  }
  EXPECT_EQ(cache.stats().entries, 7) << "written behind, still in memory";
  sa.clear();
  sb.clear();
  EXPECT_EQ(cache.clear(), 7);
  ASSERT_TRUE(written(tier));
  EXPECT_EQ(tier.stats().written, 7) << "evicting a block on disk writes nothing";
  EXPECT_EQ(tier.stats().dropped, 0);
}

// demote_idle(0) sends every block nobody holds to disk (leaves, then the parents that
// become leaves); a running sequence's path stays.
TEST_F(PrefixCacheTest, DemotingIdleBlocksSendsEveryUnheldOneToDisk) {
  TempDir dir("kettle_prefix_ssd");
  SsdTier tier(ssd_options(dir.path()), kIdentity);
  PrefixCache cache(pool_, 1 << 20);
  cache.set_disk_tier(&tier);
  const std::vector<int32_t> running_tokens = range(0, 8);
  std::vector<int32_t> idle = range(0, 4);
  for (int32_t t : range(300, 8)) idle.push_back(t);  // shares the first block with the running one
  const std::vector<int32_t> other = range(900, 8);
  KvCache running = filled(pool_, running_tokens);
  PrefixCache::Hold hold;
  cache.insert(running_tokens, running, 0, hold);
  {
    KvCache a = filled(pool_, idle), b = filled(pool_, other);
    cache.insert(idle, a);
    cache.insert(other, b);
  }
  ASSERT_EQ(cache.stats().entries, 6);
  EXPECT_EQ(cache.demote_idle(3600), 0) << "nothing has been idle for an hour";
  EXPECT_EQ(cache.demote_idle(0), 4);
  ASSERT_TRUE(written(tier));
  EXPECT_EQ(tier.stats().written, 4);
  EXPECT_EQ(cache.stats().entries, 2);
  EXPECT_EQ(cache.not_on_disk(), 2) << "the running sequence's blocks";
  for (std::vector<int32_t> p : {idle, other}) {
    p.push_back(-1);
    const std::vector<Sha256Digest> d = cache.digests(p, 0);
    const size_t in_memory = cache.blocks_in_memory(p, 0);
    EXPECT_EQ(tier.on_disk(std::span(d).subspan(in_memory)), d.size() - in_memory);
  }
  std::vector<int32_t> p = running_tokens;
  p.push_back(-1);
  EXPECT_EQ(cache.match(p).tokens, 8);
  EXPECT_EQ(pool_.used_blocks(KvPool::kFull), 2);
  hold.release();
}

}  // namespace
}  // namespace kettle
