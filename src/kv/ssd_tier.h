// SsdTier: the prefix cache's disk tier (--ssd-cache DIR). Blocks leaving
// memory (evicted, demoted when idle, written behind) are queued here and
// written by the tier's own I/O thread, one entry file each (kv/ssd_entry.h),
// under DIR/<model>-<fingerprint>/<kv policy>-<layout hash>/; a prompt whose
// next blocks are on disk has them read back by that thread, and the engine
// thread puts them into the pool. The engine thread never waits on the disk.
//
// At start the directory is locked (DIR/.kettle.lock, flock: two servers never
// share it) and its entries are indexed by a background scan of their headers;
// lookups meanwhile simply miss. A bad, foreign or stray file is logged and
// removed. Entries past `max_bytes` go least recently used first. A disk that
// refuses writes (full, read-only, no permission) stops the spilling — logged
// and counted — and serving goes on.
//
// A prefix block is named by its digest: SHA-256 over the digest before it (the
// first block: over its scope) and its own token ids, so an entry found by
// digest holds the KV of exactly that prefix.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/ssd_entry.h"

namespace kettle {

// The digest a scope's first block chains from, and the next block's.
Sha256Digest prefix_root_digest(uint64_t scope);
Sha256Digest prefix_block_digest(const Sha256Digest& parent, std::span<const int32_t> tokens);

struct SsdOptions {
  std::filesystem::path dir;          // empty: no disk tier
  size_t max_bytes = 0;               // 0: unlimited
  bool verify = false;                // check tensor checksums on every read
  double demote_idle_seconds = 300;   // cached blocks unused this long leave memory for disk
  size_t queue_bytes = size_t{512} << 20;  // spills waiting to be written, at most
};

// A block leaving memory: its place in a prefix and one pool block per kind (empty:
// the kind holds none for it).
struct SsdBlock {
  // kEntry: a prefix block. kCheckpoint: a generation's saved state (`checkpoint`, named
  // by `digest`, its request's identity), written after the blocks queued before it.
  // kForget: that checkpoint's file removed (the generation finished).
  enum class Op { kEntry, kCheckpoint, kForget } op = Op::kEntry;
  std::string checkpoint;
  uint64_t scope = 0;
  int64_t depth = 0;
  Sha256Digest parent{}, digest{};
  std::vector<int32_t> tokens;
  std::array<std::vector<uint8_t>, 2> kinds;
};

struct SsdStats {
  int64_t entries = 0;
  size_t bytes = 0;
  size_t max_bytes = 0;
  bool scanning = false;         // the start-up index scan is still running
  int64_t hits = 0;              // prompts that found blocks on disk
  int64_t restores = 0;          // blocks read back
  size_t restore_bytes = 0;
  double restore_seconds = 0.0;  // reading them (the I/O thread's time)
  int64_t written = 0;           // entries written
  size_t written_bytes = 0;
  int64_t queued = 0;            // spills waiting
  size_t queued_bytes = 0;
  int64_t dropped = 0;           // spills not taken (queue full, spilling stopped)
  int64_t errors = 0;            // failed writes and reads, bad files found
  int64_t removed = 0;           // bad or foreign files removed, entries evicted past max_bytes
  bool spilling = true;          // false once the disk refused a write
  int64_t checkpoints = 0;       // generation checkpoints on disk
  int64_t checkpoints_written = 0;
  int64_t resumed = 0;           // checkpoints read back (a generation resumed)
};

class SsdTier {
 public:
  // Locks and indexes `options.dir` for `identity` (the scan runs in the background).
  // Throws kettle::Error when another server holds the directory or it cannot be used.
  SsdTier(SsdOptions options, SsdIdentity identity);
  ~SsdTier();  // finishes the write under way; what is still queued is dropped (wait_written first)
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  const SsdOptions& options() const { return options_; }
  const std::filesystem::path& entry_dir() const { return entry_dir_; }

  // Whether an entry with this digest is on disk.
  bool contains(const Sha256Digest& digest) const;
  // How many of `digests` (in prefix order, from the first) are on disk.
  size_t on_disk(std::span<const Sha256Digest> digests) const;

  // Queues a block for writing; false when it is not taken (the queue is full, spilling
  // stopped): the block is then lost with its memory, and counted.
  bool save(SsdBlock block);

  // Reads the entries `digests` (a prefix's consecutive blocks) in the background; the
  // engine collects them with take_restored(). Returns a ticket.
  int64_t restore(std::vector<Sha256Digest> digests);
  // Generation checkpoints (--generation-checkpoint), named by their request's identity:
  // queued behind the blocks they need (save with Op::kCheckpoint / kForget), listed at the
  // scan, read back in the background like entries.
  bool has_checkpoint(const Sha256Digest& key) const;
  int64_t load_checkpoint(const Sha256Digest& key);
  struct Restored {
    int64_t ticket = 0;
    std::vector<SsdEntry> entries;  // the first ones that read back whole, in order
    std::string checkpoint;         // load_checkpoint: the saved state; empty when it failed
  };
  std::vector<Restored> take_restored();
  // Called from the I/O thread, under the tier's lock (so it must not call the tier), when
  // a restore is ready to take; after set_restore_listener({}) returns it is never called.
  void set_restore_listener(std::function<void()> listener);

  // Waits until every queued spill is written (or failed), up to `deadline`; returns
  // whether the queue is empty.
  bool wait_written(std::chrono::steady_clock::time_point deadline);

  // Deletes every entry (POST /admin/cache/clear); returns how many.
  int64_t clear();

  SsdStats stats() const;

 private:
  struct Indexed {
    size_t bytes = 0;
    std::chrono::system_clock::time_point used;
  };
  struct ReadJob {
    int64_t ticket;
    std::vector<Sha256Digest> digests;
    bool checkpoint = false;  // digests[0] names a checkpoint
  };
  void lock_directory();
  void scan();
  void io_loop();
  void write(SsdBlock& block);
  void read(ReadJob& job);
  void read_checkpoint(ReadJob& job);
  void write_checkpoint(SsdBlock& op);
  void finish_read(Restored done);
  std::filesystem::path checkpoint_path(const Sha256Digest& key) const;
  SsdEntry read_checked(const Sha256Digest& digest) const;
  static constexpr size_t kReadThreads = 16;  // reads in flight per restore
  void evict_past_cap();
  void remove_entry_file(const std::filesystem::path& path, const std::string& why);
  void stop_spilling(const std::string& why);

  SsdOptions options_;
  SsdIdentity identity_;
  std::filesystem::path entry_dir_;
  int lock_fd_ = -1;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable work_, written_;
  std::map<Sha256Digest, Indexed> index_;
  std::set<Sha256Digest> checkpoints_;
  std::deque<SsdBlock> writes_;
  std::deque<ReadJob> reads_;
  std::vector<Restored> restored_;
  std::function<void()> restore_listener_;
  int64_t next_ticket_ = 1;
  bool writing_ = false;  // the I/O thread holds a write taken off the queue
  bool stopping_ = false;
  SsdStats stats_;
  std::thread scanner_, io_;
};

}  // namespace kettle
