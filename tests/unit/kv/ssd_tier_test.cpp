// SsdTier on real directories: blocks saved and written by its I/O thread,
// one server per directory, a restart's scan finding what the last process
// wrote (and removing what is bad, foreign or unfinished), restores read back
// byte for byte, the byte cap by last use, and a disk that refuses writes
// (read-only, full: real tmpfs mounts) stopping the spilling, never serving.
#include "kv/ssd_tier.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "util/error.h"
#include "support/temp_dir.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kPatience = std::chrono::seconds(10);


// A tmpfs mounted on `dir` for the test's life (unmounted lazily, whatever happens).
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& dir, const std::string& options) : dir_(dir) {
    mounted_ = std::system(("mount -t tmpfs -o " + options + " tmpfs '" + dir.string() + "' 2>/dev/null").c_str()) == 0;
  }
  ~TmpfsMount() {
    if (!mounted_) return;
    const int rc = std::system(("umount -l '" + dir_.string() + "'").c_str());
    if (rc != 0) ADD_FAILURE() << "umount -l " << dir_ << " failed";
  }
  bool mounted() const { return mounted_; }
  bool remount(const std::string& options) {
    return std::system(("mount -o remount," + options + " '" + dir_.string() + "' 2>/dev/null").c_str()) == 0;
  }

 private:
  fs::path dir_;
  bool mounted_ = false;
};

SsdIdentity identity(const std::string& fingerprint = "weights-A") {
  return {"org/model-7b", fingerprint, "tokenizer-1", "plain layers=2 heads=1x4 block=4"};
}

SsdOptions options_for(const fs::path& dir, size_t max_bytes = 0, bool verify = false) {
  SsdOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.verify = verify;
  return o;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// `n` consecutive blocks of one prefix in `scope` (4 tokens each from `first_token`), each
// with `bytes0` bytes of kind 0 and `bytes1` of kind 1.
std::vector<SsdBlock> chain(uint64_t scope, int n, int32_t first_token, size_t bytes0, size_t bytes1 = 0) {
  std::vector<SsdBlock> out;
  Sha256Digest parent = prefix_root_digest(scope);
  for (int i = 0; i < n; ++i) {
    SsdBlock b;
    b.scope = scope;
    b.depth = i;
    b.parent = parent;
    for (int t = 0; t < 4; ++t) b.tokens.push_back(first_token + 4 * i + t);
    b.digest = prefix_block_digest(parent, b.tokens);
    b.kinds[0] = random_bytes(bytes0, static_cast<uint32_t>(first_token + 4 * i));
    if (bytes1 > 0) b.kinds[1] = random_bytes(bytes1, static_cast<uint32_t>(first_token + 4 * i + 1));
    parent = b.digest;
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<Sha256Digest> digests_of(const std::vector<SsdBlock>& blocks) {
  std::vector<Sha256Digest> d;
  for (const SsdBlock& b : blocks) d.push_back(b.digest);
  return d;
}

template <typename Predicate>
bool eventually(Predicate done) {
  const auto deadline = Clock::now() + kPatience;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

bool scanned(const SsdTier& tier) {
  return eventually([&] { return !tier.stats().scanning; });
}

void save_all(SsdTier& tier, const std::vector<SsdBlock>& blocks) {
  for (const SsdBlock& b : blocks) ASSERT_TRUE(tier.save(b));
  ASSERT_TRUE(tier.wait_written(Clock::now() + kPatience));
}

// The restore `ticket`, polled for (bounded); restores of other tickets taken meanwhile are
// dropped, so a caller waits for one restore at a time.
std::optional<SsdTier::Restored> restored(SsdTier& tier, int64_t ticket) {
  std::optional<SsdTier::Restored> out;
  eventually([&] {
    for (SsdTier::Restored& r : tier.take_restored())
      if (r.ticket == ticket) out = std::move(r);
    return out.has_value();
  });
  return out;
}

std::vector<uint8_t> bytes_of(std::span<const uint8_t> s) {
  return {s.begin(), s.end()};
}

// The entry read back holds exactly the block saved: its place and both kinds' bytes.
void expect_same(const SsdEntry& e, const SsdBlock& b) {
  EXPECT_EQ(e.header.digest, b.digest);
  EXPECT_EQ(e.header.parent, b.parent);
  EXPECT_EQ(e.header.tokens, b.tokens);
  EXPECT_EQ(e.header.scope, b.scope);
  EXPECT_EQ(e.header.depth, b.depth);
  size_t t = 0;
  for (int kind = 0; kind < 2; ++kind) {
    if (b.kinds[static_cast<size_t>(kind)].empty()) continue;
    ASSERT_LT(t, e.header.tensors.size());
    EXPECT_EQ(e.header.tensors[t].kind, kind);
    EXPECT_EQ(bytes_of(e.tensor(t)), b.kinds[static_cast<size_t>(kind)]) << "kind " << kind;
    ++t;
  }
  EXPECT_EQ(t, e.header.tensors.size());
}

// The files of an entry directory (its checkpoints/ folder aside).
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void flip_byte(const fs::path& path, size_t at) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST(SsdTier, SavedBlocksAreWrittenAndCounted) {
  TempDir dir("kettle_ssd_tier");
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  const std::vector<SsdBlock> blocks = chain(7, 3, 100, 5000, 3000);  // each: 4096 + 8192 + 4096 bytes
  save_all(tier, blocks);
  const SsdStats s = tier.stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.written, 3);
  EXPECT_EQ(s.bytes, 3u * 16384);
  EXPECT_EQ(s.written_bytes, 3u * 16384);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.queued_bytes, 0u);
  EXPECT_EQ(s.errors, 0);
  EXPECT_TRUE(s.spilling);
  EXPECT_TRUE(fs::exists(dir.path() / ".kettle.lock"));
  EXPECT_EQ(tier.entry_dir().parent_path().parent_path(), dir.path()) << "DIR/<model>/<kv policy>/";
  std::vector<std::string> expected;
  for (const SsdBlock& b : blocks) {
    EXPECT_TRUE(tier.contains(b.digest));
    expected.push_back(ssd_entry_name(b.digest));
    expect_same(read_ssd_entry(tier.entry_dir() / ssd_entry_name(b.digest), true), b);
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files_in(tier.entry_dir()), expected) << "one file per entry, no temporary left";
  const std::vector<Sha256Digest> d = digests_of(blocks);
  EXPECT_EQ(tier.on_disk(d), 3u);
  EXPECT_EQ(tier.on_disk(std::vector<Sha256Digest>{d[0], sha256("x", 1), d[2]}), 1u)
      << "counted from the first, up to a gap";
  EXPECT_EQ(tier.on_disk(std::vector<Sha256Digest>{}), 0u);
  ASSERT_TRUE(tier.save(blocks[1]));  // on disk already: not written twice
  ASSERT_TRUE(tier.wait_written(Clock::now() + kPatience));
  EXPECT_EQ(tier.stats().written, 3);
  EXPECT_EQ(tier.stats().entries, 3);
}

TEST(SsdTier, ASecondTierOnTheSameDirectoryIsRefused) {
  TempDir dir("kettle_ssd_tier");
  {
    SsdTier first(options_for(dir.path()), identity());
    try {
      SsdTier second(options_for(dir.path()), identity("weights-B"));
      ADD_FAILURE() << "two tiers share a directory";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("another kettle server"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(::getpid())), std::string::npos) << "names the holder's pid";
    }
    EXPECT_TRUE(first.save(chain(0, 1, 0, 100)[0])) << "the first is untouched by the refusal";
    EXPECT_TRUE(first.wait_written(Clock::now() + kPatience));
    EXPECT_EQ(first.stats().entries, 1);
  }
  EXPECT_NO_THROW(SsdTier again(options_for(dir.path()), identity())) << "the lock goes with its tier";
}

TEST(SsdTier, ADirectoryThatIsAFileIsRefused) {
  TempDir dir("kettle_ssd_tier");
  std::ofstream(dir.path() / "file") << "x";
  EXPECT_THROW(SsdTier tier(options_for(dir.path() / "file"), identity()), Error);
}

TEST(SsdTier, ARestartFindsTheEntriesAndRestoresThemByteForByte) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> blocks = chain(3, 4, 40, 4096, 100);
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
  }
  SsdTier tier(options_for(dir.path()), identity());
  std::mutex mutex;
  std::condition_variable ready;
  int calls = 0;
  tier.set_restore_listener([&] {
    std::lock_guard lock(mutex);
    ++calls;
    ready.notify_all();
  });
  ASSERT_TRUE(scanned(tier));
  SsdStats s = tier.stats();
  EXPECT_EQ(s.entries, 4);
  EXPECT_EQ(s.bytes, 4u * (4096 + 4096 + 4096));
  EXPECT_EQ(s.removed, 0);
  EXPECT_EQ(s.errors, 0);
  const std::vector<Sha256Digest> d = digests_of(blocks);
  EXPECT_EQ(tier.on_disk(d), 4u);

  const int64_t ticket = tier.restore(d);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(ready.wait_for(lock, kPatience, [&] { return calls == 1; })) << "the listener is called";
  }
  std::vector<SsdTier::Restored> all = tier.take_restored();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].ticket, ticket);
  ASSERT_EQ(all[0].entries.size(), 4u);
  for (size_t i = 0; i < 4; ++i) expect_same(all[0].entries[i], blocks[i]);
  EXPECT_TRUE(tier.take_restored().empty()) << "taken once";
  s = tier.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.restores, 4);
  EXPECT_EQ(s.restore_bytes, 4u * 12288);

  // A later part of the prefix alone, and a digest that is not there.
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore({d[2], d[3]}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->entries.size(), 2u);
  expect_same(r->entries[0], blocks[2]);
  r = restored(tier, tier.restore({sha256("nothing", 7), d[0]}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->entries.empty()) << "entries are the first ones that read back";
  EXPECT_EQ(tier.on_disk(d), 4u) << "nothing on disk was harmed by the miss";
}

TEST(SsdTier, AnotherModelHasItsOwnDirectoryAndItsFilesAreRemovedFromOurs) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> ours = chain(0, 2, 0, 1000), theirs = chain(0, 2, 1000, 1000);
  fs::path our_dir, their_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, ours);
    our_dir = tier.entry_dir();
  }
  {
    SsdTier foreign(options_for(dir.path()), identity("weights-B"));
    ASSERT_TRUE(scanned(foreign));
    their_dir = foreign.entry_dir();
    EXPECT_NE(their_dir, our_dir);
    EXPECT_EQ(foreign.stats().entries, 0) << "another model's entries are not seen";
    EXPECT_EQ(foreign.on_disk(digests_of(ours)), 0u);
    std::optional<SsdTier::Restored> r = restored(foreign, foreign.restore(digests_of(ours)));
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->entries.empty());
    save_all(foreign, theirs);
  }
  SsdIdentity other_layout = identity();
  other_layout.kv_layout = "turbo layers=2 heads=1x4 block=4";
  {
    SsdTier tier(options_for(dir.path()), other_layout);
    EXPECT_NE(tier.entry_dir(), our_dir) << "another KV layout: another directory";
    EXPECT_EQ(tier.entry_dir().parent_path(), our_dir.parent_path()) << "same model, same tokenizer";
  }
  // One of their files put into our directory (a copy, a bad rename) is removed at our scan.
  const std::string name = ssd_entry_name(theirs[0].digest);
  fs::copy_file(their_dir / name, our_dir / name);
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  const SsdStats s = tier.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.removed, 1);
  EXPECT_EQ(s.errors, 1);
  EXPECT_FALSE(fs::exists(our_dir / name));
  EXPECT_TRUE(fs::exists(their_dir / name)) << "their own directory is not ours to clean";
  EXPECT_FALSE(tier.contains(theirs[0].digest));
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore({theirs[0].digest}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->entries.empty()) << "never restored";
  EXPECT_EQ(tier.on_disk(digests_of(ours)), 2u);
}

TEST(SsdTier, AFileWithAFlippedHeaderByteIsRemovedAtScan) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> blocks = chain(0, 3, 0, 2000);
  fs::path entry_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
    entry_dir = tier.entry_dir();
  }
  const fs::path bad = entry_dir / ssd_entry_name(blocks[1].digest);
  flip_byte(bad, 60);  // inside the JSON header
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_EQ(tier.stats().entries, 2);
  EXPECT_EQ(tier.stats().removed, 1);
  EXPECT_EQ(tier.stats().errors, 1);
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_EQ(tier.on_disk(digests_of(blocks)), 1u);
  EXPECT_TRUE(tier.contains(blocks[2].digest));
}

// Other damage the scan finds: an entry whose name is not its digest, a truncated one,
// something that is no entry at all.
TEST(SsdTier, MisnamedTruncatedAndForeignFilesAreRemovedAtScan) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> blocks = chain(0, 3, 0, 5000);
  fs::path entry_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
    entry_dir = tier.entry_dir();
  }
  const fs::path misnamed = entry_dir / ssd_entry_name(sha256("elsewhere", 9));
  fs::copy_file(entry_dir / ssd_entry_name(blocks[0].digest), misnamed);
  const fs::path truncated = entry_dir / ssd_entry_name(blocks[2].digest);
  fs::resize_file(truncated, fs::file_size(truncated) - 4096);
  std::ofstream(entry_dir / "notes.txt") << "not an entry";
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_EQ(tier.stats().entries, 2);
  EXPECT_EQ(tier.stats().removed, 3);
  EXPECT_EQ(tier.stats().errors, 3);
  std::vector<std::string> expected = {ssd_entry_name(blocks[0].digest), ssd_entry_name(blocks[1].digest)};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files_in(entry_dir), expected);
}

// With verify the tensors' checksums are checked on every read: a damaged entry ends the
// restore there and is removed. Without it only the header is checked and the damaged
// bytes come back (the documented cost of --ssd-cache without verify).
TEST(SsdTier, AFlippedTensorByteIsCaughtOnlyWhenVerifying) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> blocks = chain(0, 3, 0, 6000);
  fs::path entry_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
    entry_dir = tier.entry_dir();
  }
  const fs::path damaged = entry_dir / ssd_entry_name(blocks[1].digest);
  const uint64_t offset = read_ssd_header(damaged).tensors[0].offset;
  flip_byte(damaged, offset + 123);
  const std::vector<Sha256Digest> d = digests_of(blocks);
  {
    SsdTier tier(options_for(dir.path(), 0, /*verify=*/false), identity());
    ASSERT_TRUE(scanned(tier));
    EXPECT_EQ(tier.stats().entries, 3) << "the scan reads headers only";
    std::optional<SsdTier::Restored> r = restored(tier, tier.restore(d));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->entries.size(), 3u) << "not detected without verify";
    std::vector<uint8_t> expected = blocks[1].kinds[0];
    expected[123] ^= 0x10;
    EXPECT_EQ(bytes_of(r->entries[1].tensor(0)), expected);
    EXPECT_EQ(tier.stats().errors, 0);
  }
  SsdTier tier(options_for(dir.path(), 0, /*verify=*/true), identity());
  ASSERT_TRUE(scanned(tier));
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore(d));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->entries.size(), 1u) << "the restore stops at the damaged entry";
  expect_same(r->entries[0], blocks[0]);
  EXPECT_FALSE(fs::exists(damaged));
  EXPECT_FALSE(tier.contains(blocks[1].digest));
  EXPECT_EQ(tier.stats().entries, 2);
  EXPECT_EQ(tier.stats().bytes, 2u * (4096 + 8192));
  EXPECT_GE(tier.stats().errors, 1);
  EXPECT_EQ(tier.stats().removed, 1);
  r = restored(tier, tier.restore({d[1]}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->entries.empty());
}

TEST(SsdTier, AnotherProcesssUnfinishedWriteIsRemovedAtScan) {
  TempDir dir("kettle_ssd_tier");
  const std::vector<SsdBlock> blocks = chain(0, 1, 0, 100);
  fs::path entry_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
    entry_dir = tier.entry_dir();
  }
  const int other_pid = ::getpid() == 4242424 ? 4242425 : 4242424;
  const fs::path stray =
      entry_dir / ("." + ssd_entry_name(blocks[0].digest) + "." + std::to_string(other_pid) + ".0.tmp");
  const fs::path short_stray = entry_dir / ".x.tmp";
  std::ofstream(stray) << "half an entry";
  std::ofstream(short_stray) << "";
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_FALSE(fs::exists(short_stray));
  EXPECT_EQ(tier.stats().removed, 2);
  EXPECT_EQ(tier.stats().entries, 1);
  EXPECT_EQ(files_in(entry_dir), std::vector<std::string>{ssd_entry_name(blocks[0].digest)});
}

// Past max_bytes the least recently used entries go: written, or read back, counts as a use.
TEST(SsdTier, TheByteCapEvictsTheLeastRecentlyUsed) {
  TempDir dir("kettle_ssd_tier");
  const size_t entry = 2 * kSsdAlignment;  // header page + one tensor page
  const size_t cap = entry * 5 / 2;
  SsdTier tier(options_for(dir.path(), cap), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_EQ(tier.stats().max_bytes, cap);
  const std::vector<SsdBlock> blocks = chain(0, 6, 0, 1000);
  save_all(tier, {blocks[0]});
  save_all(tier, {blocks[1]});
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore({blocks[0].digest}));  // block 0 is used again
  ASSERT_TRUE(r);
  ASSERT_EQ(r->entries.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  save_all(tier, {blocks[2]});
  EXPECT_LE(tier.stats().bytes, cap);
  EXPECT_TRUE(tier.contains(blocks[0].digest)) << "read back after block 1 was written";
  EXPECT_FALSE(tier.contains(blocks[1].digest)) << "the least recently used";
  EXPECT_TRUE(tier.contains(blocks[2].digest));
  for (size_t i = 3; i < blocks.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    save_all(tier, {blocks[i]});
    EXPECT_LE(tier.stats().bytes, cap);
  }
  const SsdStats s = tier.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.bytes, 2 * entry);
  EXPECT_EQ(s.removed, 4);
  EXPECT_EQ(s.written, 6);
  EXPECT_TRUE(tier.contains(blocks[4].digest));
  EXPECT_TRUE(tier.contains(blocks[5].digest));
  std::vector<std::string> expected = {ssd_entry_name(blocks[4].digest), ssd_entry_name(blocks[5].digest)};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files_in(tier.entry_dir()), expected) << "evicted entries leave the disk";
}

// The cap is also a promise about what a restart finds: a directory left over the cap (a
// smaller --ssd-cache-max after a restart) is brought under it once the scan is done,
// not only when the next block is written.
// A directory left over its cap (a restart with a smaller --ssd-cache-max) is trimmed once
// the scan has indexed it.
TEST(SsdTier, ARestartOverTheCapIsTrimmedAfterTheScan) {
  TempDir dir("kettle_ssd_tier");
  const size_t entry = 2 * kSsdAlignment;
  const std::vector<SsdBlock> blocks = chain(0, 4, 0, 1000);
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
  }
  SsdTier tier(options_for(dir.path(), entry * 5 / 2), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_TRUE(eventually([&] { return tier.stats().bytes <= entry * 5 / 2; })) << tier.stats().bytes << " bytes";
}

TEST(SsdTier, ClearDeletesEveryEntry) {
  TempDir dir("kettle_ssd_tier");
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  const std::vector<SsdBlock> blocks = chain(0, 3, 0, 100);
  save_all(tier, blocks);
  EXPECT_EQ(tier.clear(), 3);
  EXPECT_EQ(tier.stats().entries, 0);
  EXPECT_EQ(tier.stats().bytes, 0u);
  EXPECT_TRUE(files_in(tier.entry_dir()).empty());
  EXPECT_EQ(tier.on_disk(digests_of(blocks)), 0u);
  save_all(tier, blocks);  // and the blocks may come again
  EXPECT_EQ(tier.stats().entries, 3);
}

// Tests run as root, which ignores mode bits: a read-only filesystem is the real refusal.
TEST(SsdTier, AReadOnlyDirectoryServesWithoutSpilling) {
  TempDir dir("kettle_ssd_tier");
  TmpfsMount mount(dir.path(), "size=1m,ro");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs here (mount needs CAP_SYS_ADMIN)";
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_FALSE(tier.stats().spilling);
  EXPECT_FALSE(tier.save(chain(0, 1, 0, 100)[0]));
  EXPECT_EQ(tier.stats().dropped, 1);
  EXPECT_EQ(tier.stats().entries, 0);
  EXPECT_TRUE(tier.wait_written(Clock::now() + kPatience));
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore({sha256("a", 1)}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->entries.empty());
}

// A cache written earlier and now mounted read-only still serves what it holds.
TEST(SsdTier, AReadOnlyCacheStillRestores) {
  TempDir dir("kettle_ssd_tier");
  TmpfsMount mount(dir.path(), "size=1m");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (mount needs CAP_SYS_ADMIN)";
  const std::vector<SsdBlock> blocks = chain(0, 2, 0, 3000);
  {
    SsdTier tier(options_for(dir.path()), identity());
    save_all(tier, blocks);
  }
  ASSERT_TRUE(mount.remount("ro"));
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_FALSE(tier.stats().spilling);
  EXPECT_EQ(tier.stats().entries, 2);
  std::optional<SsdTier::Restored> r = restored(tier, tier.restore(digests_of(blocks)));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->entries.size(), 2u);
  expect_same(r->entries[1], blocks[1]);
}

TEST(SsdTier, AFullDiskStopsSpillingAndKeepsOnlyWholeEntries) {
  TempDir dir("kettle_ssd_tier");
  TmpfsMount mount(dir.path(), "size=256k");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (mount needs CAP_SYS_ADMIN)";
  std::vector<SsdBlock> blocks = chain(0, 40, 0, 12000, 900);  // 4 + 12 + 4 KiB each: 800 KiB
  std::optional<SsdTier> tier;
  ASSERT_NO_THROW(tier.emplace(options_for(dir.path()), identity()));
  ASSERT_TRUE(scanned(*tier));
  int64_t taken = 0;
  for (const SsdBlock& b : blocks) {
    bool took = false;
    ASSERT_NO_THROW(took = tier->save(b));
    taken += took;
  }
  ASSERT_TRUE(tier->wait_written(Clock::now() + kPatience));
  const SsdStats s = tier->stats();
  EXPECT_FALSE(s.spilling);
  EXPECT_GT(s.errors, 0);
  EXPECT_GT(s.entries, 0) << "the disk held some before it filled";
  EXPECT_LT(s.entries, 16);
  EXPECT_EQ(s.queued, 0);
  EXPECT_FALSE(tier->save(blocks[0])) << "spilling stopped";
  // Every entry the index counts is on disk whole; nothing else is (no temporaries).
  size_t bytes = 0;
  int64_t counted = 0;
  std::vector<std::string> expected;
  for (const SsdBlock& b : blocks) {
    if (!tier->contains(b.digest)) continue;
    ++counted;
    const fs::path path = tier->entry_dir() / ssd_entry_name(b.digest);
    expected.push_back(path.filename().string());
    bytes += fs::file_size(path);
    SsdEntry e;
    ASSERT_NO_THROW(e = read_ssd_entry(path, true));
    expect_same(e, b);
  }
  EXPECT_EQ(counted, s.entries);
  EXPECT_EQ(bytes, s.bytes);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files_in(tier->entry_dir()), expected);
  // Restores still work from a full disk.
  std::optional<SsdTier::Restored> r = restored(*tier, tier->restore(digests_of(blocks)));
  ASSERT_TRUE(r);
  EXPECT_EQ(static_cast<int64_t>(r->entries.size()), s.entries) << "the written ones are the first of the chain";
  tier.reset();
}

// Every spill save() took ends in a counter: written, an error, or dropped.
// Every block the tier took is accounted for: written, failed, or dropped (queued when the
// disk refused).
TEST(SsdTier, EverySpillTakenIsWrittenFailedOrDropped) {
  TempDir dir("kettle_ssd_tier");
  TmpfsMount mount(dir.path(), "size=256k");
  if (!mount.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (mount needs CAP_SYS_ADMIN)";
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  int64_t attempts = 0;
  for (const SsdBlock& b : chain(0, 40, 0, 12000)) {
    tier.save(b);
    ++attempts;
  }
  ASSERT_TRUE(tier.wait_written(Clock::now() + kPatience));
  const SsdStats s = tier.stats();
  EXPECT_EQ(s.written + s.errors + s.dropped, attempts)
      << "written " << s.written << ", errors " << s.errors << ", dropped " << s.dropped;
}

// A temporary file is an unfinished write unless this tier is writing it. A server that
// always runs as the same pid (PID 1 in a container) must still clean up the temporaries
// its crashed predecessor left.
// A temporary left by a crashed process with the same pid (PID 1 in a container) is removed:
// temporaries carry a random tag per process, not only the pid.
TEST(SsdTier, AStaleTemporaryOfTheSamePidIsRemovedAtScan) {
  TempDir dir("kettle_ssd_tier");
  fs::path entry_dir;
  {
    SsdTier tier(options_for(dir.path()), identity());
    entry_dir = tier.entry_dir();
  }
  const fs::path stale = entry_dir / (".abc.kv." + std::to_string(::getpid()) + ".0.tmp");
  std::ofstream(stale) << "left by a crash";
  SsdTier tier(options_for(dir.path()), identity());
  ASSERT_TRUE(scanned(tier));
  EXPECT_FALSE(fs::exists(stale));
}

}  // namespace
}  // namespace kettle
