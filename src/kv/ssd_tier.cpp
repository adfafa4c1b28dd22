// The disk tier's threads: the scanner indexes what a previous process left
// (checking every header, removing what is bad or foreign), the I/O thread
// serves reads first (a prompt waits on them), then writes, and keeps the
// directory under its byte cap by last use.
#include "kv/ssd_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <atomic>
#include <optional>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "util/error.h"
#include "util/log.h"
#include "util/timer.h"

namespace kettle {
namespace {

bool refuses_writes(int error) { return error == ENOSPC || error == EROFS || error == EACCES || error == EPERM || error == EDQUOT; }

std::string short_hash(const std::string& text) { return hex(sha256(text.data(), text.size())).substr(0, 16); }

// Readable and unique: the model's name and a hash of its identity; the KV policy's name
// (its first word of the layout) and a hash of the whole layout.
std::filesystem::path entry_dir_for(const std::filesystem::path& dir, const SsdIdentity& id) {
  std::string model = id.model_id.empty() ? "model" : id.model_id;
  std::replace_if(model.begin(), model.end(), [](char c) { return c == '/' || c == '\\' || c == '.'; }, '_');
  const std::string policy = id.kv_layout.substr(0, id.kv_layout.find(' '));
  return dir / (model + "-" + short_hash(id.model_fingerprint + "\n" + id.tokenizer_hash)) /
         (policy + "-" + short_hash(id.kv_layout));
}

}  // namespace

Sha256Digest prefix_root_digest(uint64_t scope) {
  Sha256 h;
  h.update(std::string("kettle prefix v1"));
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(scope >> (8 * i));
  return h.update(bytes, 8).finish();
}

Sha256Digest prefix_block_digest(const Sha256Digest& parent, std::span<const int32_t> tokens) {
  Sha256 h;
  h.update(parent);
  for (int32_t t : tokens) {
    uint8_t bytes[4];
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(static_cast<uint32_t>(t) >> (8 * i));
    h.update(bytes, 4);
  }
  return h.finish();
}

SsdTier::SsdTier(SsdOptions options, SsdIdentity identity)
    : options_(std::move(options)), identity_(std::move(identity)), entry_dir_(entry_dir_for(options_.dir, identity_)) {
  stats_.max_bytes = options_.max_bytes;
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (!std::filesystem::is_directory(options_.dir))
    fail(ErrorCategory::kInvalidArgument, "--ssd-cache {}: not a directory{}", options_.dir.string(),
         ec ? " (" + ec.message() + ")" : "");
  lock_directory();
  std::filesystem::create_directories(entry_dir_ / "checkpoints", ec);
  if (ec || ::access(entry_dir_.c_str(), W_OK) != 0)
    stop_spilling(fmt::format("{} is not writable ({})", entry_dir_.string(), ec ? ec.message() : std::strerror(errno)));
  stats_.scanning = true;
  scanner_ = std::thread([this] { scan(); });
  io_ = std::thread([this] { io_loop(); });
}

SsdTier::~SsdTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (scanner_.joinable()) scanner_.join();
  if (io_.joinable()) io_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void SsdTier::lock_directory() {
  const std::filesystem::path path = options_.dir / ".kettle.lock";
  bool writable = true;
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) {  // a read-only directory: lock what is there
    writable = false;
    lock_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (lock_fd_ < 0) lock_fd_ = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (lock_fd_ < 0)
    fail(ErrorCategory::kInvalidArgument, "--ssd-cache {}: cannot open it: {}", options_.dir.string(), std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    [[maybe_unused]] ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    fail(ErrorCategory::kInvalidArgument, "--ssd-cache {}: another kettle server uses this directory (pid {}); give "
         "each server its own", options_.dir.string(), pid[0] ? std::string(pid) : std::string("unknown"));
  }
  if (writable) {
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(lock_fd_, 0) == 0) {
      [[maybe_unused]] ssize_t n = ::pwrite(lock_fd_, pid.data(), pid.size(), 0);
    }
  }
}

// Under the lock (or before the threads start). What is queued will not be written: dropped.
void SsdTier::stop_spilling(const std::string& why) {
  if (!stats_.spilling) return;
  stats_.spilling = false;
  stats_.dropped += static_cast<int64_t>(writes_.size());
  for (const SsdBlock& block : writes_) {  // the one being written is counted off when it returns
    --stats_.queued;
    for (const auto& k : block.kinds) stats_.queued_bytes -= k.size();
  }
  writes_.clear();
  written_.notify_all();
  log::warn("ssd cache: spilling stopped: {}; serving goes on without writing to disk", why);
}

void SsdTier::remove_entry_file(const std::filesystem::path& path, const std::string& why) {
  log::warn("ssd cache: removing {}: {}", path.filename().string(), why);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::lock_guard lock(mutex_);
  ++stats_.removed;
}

void SsdTier::scan() {
  std::error_code ec;
  std::filesystem::directory_iterator it(entry_dir_, ec), end;
  const std::string own = "." + ssd_temporary_tag() + ".";
  for (; !ec && it != end; it.increment(ec)) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) break;
    }
    const std::filesystem::path path = it->path();
    const std::string name = path.filename().string();
    if (it->is_directory()) continue;  // checkpoints/
    if (name.ends_with(".tmp")) {  // a write cut short by a crash (ours are still being written)
      if (name.find(own) == std::string::npos) remove_entry_file(path, "an unfinished write");
      continue;
    }
    try {
      const SsdEntryHeader h = read_ssd_header(path);
      if (h.identity != identity_) throw Error(ErrorCategory::kInvalidData, "written for another model, tokenizer or KV layout");
      if (name != ssd_entry_name(h.digest) || prefix_block_digest(h.parent, h.tokens) != h.digest)
        throw Error(ErrorCategory::kInvalidData, "its name, tokens and digest disagree");
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != h.file_bytes)
        throw Error(ErrorCategory::kInvalidData, "its size is not its header's");
      std::lock_guard lock(mutex_);
      auto [entry, added] = index_.try_emplace(h.digest);
      if (added) {
        entry->second = {h.file_bytes, std::chrono::system_clock::time_point(std::chrono::seconds(st.st_mtim.tv_sec))};
        stats_.bytes += h.file_bytes;
        ++stats_.entries;
      }
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.errors;
      }
      remove_entry_file(path, e.what());
    }
  }
  for (std::filesystem::directory_iterator c(entry_dir_ / "checkpoints", ec); !ec && c != end; c.increment(ec)) {
    const std::string name = c->path().filename().string();
    if (name.ends_with(".tmp")) {
      if (name.find(own) == std::string::npos) remove_entry_file(c->path(), "an unfinished write");
      continue;
    }
    Sha256Digest key{};
    if (!name.ends_with(".json") || !parse_hex_digest(std::string_view(name).substr(0, name.size() - 5), key)) {
      remove_entry_file(c->path(), "not a checkpoint");
      continue;
    }
    std::lock_guard lock(mutex_);
    checkpoints_.insert(key);
    stats_.checkpoints = static_cast<int64_t>(checkpoints_.size());
  }
  std::lock_guard lock(mutex_);
  stats_.scanning = false;
  log::info("ssd cache: {} entries ({} MiB) in {}", stats_.entries, stats_.bytes >> 20, entry_dir_.string());
  evict_past_cap();  // the cap is enforced once the index is whole (writes meanwhile wait for it)
}

bool SsdTier::contains(const Sha256Digest& digest) const {
  std::lock_guard lock(mutex_);
  return index_.contains(digest);
}

size_t SsdTier::on_disk(std::span<const Sha256Digest> digests) const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  while (n < digests.size() && index_.contains(digests[n])) ++n;
  return n;
}

bool SsdTier::save(SsdBlock block) {
  size_t bytes = 0;
  for (const auto& k : block.kinds) bytes += k.size();
  std::lock_guard lock(mutex_);
  if (!stats_.spilling || stopping_ || (stats_.queued_bytes + bytes > options_.queue_bytes && !writes_.empty())) {
    ++stats_.dropped;
    return false;
  }
  stats_.queued_bytes += bytes;
  ++stats_.queued;
  writes_.push_back(std::move(block));
  work_.notify_one();
  return true;
}

int64_t SsdTier::restore(std::vector<Sha256Digest> digests) {
  std::lock_guard lock(mutex_);
  const int64_t ticket = next_ticket_++;
  reads_.push_back({ticket, std::move(digests)});
  work_.notify_one();
  return ticket;
}

std::vector<SsdTier::Restored> SsdTier::take_restored() {
  std::lock_guard lock(mutex_);
  return std::exchange(restored_, {});
}

void SsdTier::set_restore_listener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  restore_listener_ = std::move(listener);
}

bool SsdTier::wait_written(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return written_.wait_until(lock, deadline, [&] { return writes_.empty() && !writing_; });
}

void SsdTier::io_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !reads_.empty() || !writes_.empty(); });
    if (!reads_.empty()) {
      ReadJob job = std::move(reads_.front());
      reads_.pop_front();
      lock.unlock();
      if (job.checkpoint)
        read_checkpoint(job);
      else
        read(job);
      lock.lock();
      continue;
    }
    if (stopping_ && !writes_.empty()) {  // the owner waited (wait_written) as long as it would
      log::warn("ssd cache: {} queued blocks ({} MiB) not written at shutdown", writes_.size(), stats_.queued_bytes >> 20);
      stats_.dropped += static_cast<int64_t>(writes_.size());
      writes_.clear();
      stats_.queued = 0;
      stats_.queued_bytes = 0;
      written_.notify_all();
    }
    if (!writes_.empty()) {
      SsdBlock block = std::move(writes_.front());
      writes_.pop_front();
      writing_ = true;
      lock.unlock();
      write(block);
      lock.lock();
      writing_ = false;
      --stats_.queued;
      for (const auto& k : block.kinds) stats_.queued_bytes -= k.size();
      if (writes_.empty()) written_.notify_all();
      continue;
    }
    if (stopping_) break;
  }
}

std::filesystem::path SsdTier::checkpoint_path(const Sha256Digest& key) const {
  return entry_dir_ / "checkpoints" / (hex(key) + ".json");
}

bool SsdTier::has_checkpoint(const Sha256Digest& key) const {
  std::lock_guard lock(mutex_);
  return checkpoints_.contains(key);
}

int64_t SsdTier::load_checkpoint(const Sha256Digest& key) {
  std::lock_guard lock(mutex_);
  const int64_t ticket = next_ticket_++;
  reads_.push_back({ticket, {key}, true});
  work_.notify_one();
  return ticket;
}

// A checkpoint file: {"checksum": checksum64 of the state's text, "state": its text}.
void SsdTier::write_checkpoint(SsdBlock& op) {
  const std::filesystem::path path = checkpoint_path(op.digest);
  try {
    if (op.op == SsdBlock::Op::kForget) {
      std::error_code ec;
      std::filesystem::remove(path, ec);
      std::lock_guard lock(mutex_);
      checkpoints_.erase(op.digest);
      stats_.checkpoints = static_cast<int64_t>(checkpoints_.size());
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (!stats_.spilling) {
        ++stats_.dropped;
        return;
      }
    }
    const std::string text =
        nlohmann::json{{"checksum", checksum64(op.checkpoint.data(), op.checkpoint.size())}, {"state", op.checkpoint}}.dump();
    write_file_atomically(path.parent_path(), path.filename().string(),
                          {std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())});
    std::lock_guard lock(mutex_);
    checkpoints_.insert(op.digest);
    stats_.checkpoints = static_cast<int64_t>(checkpoints_.size());
    ++stats_.checkpoints_written;
  } catch (const std::system_error& e) {
    std::lock_guard lock(mutex_);
    ++stats_.errors;
    if (refuses_writes(e.code().value())) stop_spilling(e.what());
    else log::warn("ssd cache: {}", e.what());
  }
}

void SsdTier::read_checkpoint(ReadJob& job) {
  Restored done{job.ticket, {}, {}};
  const std::filesystem::path path = checkpoint_path(job.digests[0]);
  try {
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json j = nlohmann::json::parse(text);
    std::string state = j.at("state").get<std::string>();
    if (checksum64(state.data(), state.size()) != j.at("checksum").get<uint64_t>())
      throw Error(ErrorCategory::kInvalidData, "checkpoint checksum mismatch");
    done.checkpoint = std::move(state);
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.errors;
      checkpoints_.erase(job.digests[0]);
      stats_.checkpoints = static_cast<int64_t>(checkpoints_.size());
    }
    remove_entry_file(path, e.what());
  }
  std::lock_guard lock(mutex_);  // the listener is called under the lock: set_restore_listener({}) stops it for good
  if (!done.checkpoint.empty()) ++stats_.resumed;
  restored_.push_back(std::move(done));
  if (restore_listener_) restore_listener_();
}

void SsdTier::write(SsdBlock& block) {
  if (block.op != SsdBlock::Op::kEntry) return write_checkpoint(block);
  {
    std::lock_guard lock(mutex_);
    if (index_.contains(block.digest)) return;  // written meanwhile (handed over twice)
    if (!stats_.spilling) {
      ++stats_.dropped;
      return;
    }
  }
  SsdEntryHeader header;
  header.identity = identity_;
  header.scope = block.scope;
  header.depth = block.depth;
  header.parent = block.parent;
  header.digest = block.digest;
  header.tokens = block.tokens;
  std::vector<std::span<const uint8_t>> tensors;
  for (int kind = 0; kind < 2; ++kind) {
    if (block.kinds[static_cast<size_t>(kind)].empty()) continue;
    header.tensors.push_back({kind, 0, 0, 0});
    tensors.emplace_back(block.kinds[static_cast<size_t>(kind)]);
  }
  size_t bytes = 0;
  try {
    write_ssd_entry(entry_dir_, header, tensors);
    bytes = static_cast<size_t>(std::filesystem::file_size(entry_dir_ / ssd_entry_name(block.digest)));
  } catch (const std::system_error& e) {
    std::lock_guard lock(mutex_);
    ++stats_.errors;
    if (refuses_writes(e.code().value()))
      stop_spilling(e.what());
    else
      log::warn("ssd cache: {}", e.what());
    return;
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    ++stats_.errors;
    log::warn("ssd cache: writing an entry: {}", e.what());
    return;
  }
  std::lock_guard lock(mutex_);
  auto [entry, added] = index_.try_emplace(block.digest);
  entry->second = {bytes, std::chrono::system_clock::now()};
  if (added) {
    stats_.bytes += bytes;
    ++stats_.entries;
  }
  ++stats_.written;
  stats_.written_bytes += bytes;
  if (!stats_.scanning) evict_past_cap();
}

// Under the lock: the least recently used entries go until the directory fits its cap.
void SsdTier::evict_past_cap() {
  if (options_.max_bytes == 0 || stats_.bytes <= options_.max_bytes) return;
  std::vector<std::pair<std::chrono::system_clock::time_point, Sha256Digest>> by_use;
  for (const auto& [digest, e] : index_) by_use.push_back({e.used, digest});
  std::sort(by_use.begin(), by_use.end());
  for (const auto& [used, digest] : by_use) {
    if (stats_.bytes <= options_.max_bytes) break;
    std::error_code ec;
    std::filesystem::remove(entry_dir_ / ssd_entry_name(digest), ec);
    stats_.bytes -= index_[digest].bytes;
    --stats_.entries;
    ++stats_.removed;
    index_.erase(digest);
  }
}

// One entry read and checked against the digest asked for; throws what is wrong with it.
SsdEntry SsdTier::read_checked(const Sha256Digest& digest) const {
  SsdEntry entry = read_ssd_entry(entry_dir_ / ssd_entry_name(digest), options_.verify);
  if (entry.header.identity != identity_ || entry.header.digest != digest ||
      prefix_block_digest(entry.header.parent, entry.header.tokens) != digest)
    throw Error(ErrorCategory::kInvalidData, "its identity or digest is not the one asked for");
  return entry;
}

// The entries are read by a few threads at once (a disk serves several reads in flight
// faster than one after another), then taken in prefix order up to the first bad one.
void SsdTier::read(ReadJob& job) {
  Restored done{job.ticket, {}, {}};
  Timer timer;
  const size_t n = job.digests.size();
  std::vector<std::optional<SsdEntry>> read(n);
  std::vector<std::string> failed(n);
  std::atomic<size_t> next{0};
  auto reader = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        read[i] = read_checked(job.digests[i]);
      } catch (const std::exception& e) {
        failed[i] = e.what();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min<size_t>(kReadThreads, n); ++t) helpers.emplace_back(reader);
  reader();
  for (std::thread& t : helpers) t.join();

  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!read[i]) {
      const std::filesystem::path path = entry_dir_ / ssd_entry_name(job.digests[i]);
      {
        std::lock_guard lock(mutex_);
        ++stats_.errors;
        if (auto it = index_.find(job.digests[i]); it != index_.end()) {
          stats_.bytes -= it->second.bytes;
          --stats_.entries;
          index_.erase(it);
        }
      }
      if (std::filesystem::exists(path)) remove_entry_file(path, failed[i]);
      break;
    }
    bytes += read[i]->header.file_bytes;
    done.entries.push_back(std::move(*read[i]));
  }
  const auto now = std::chrono::system_clock::now();
  std::vector<std::filesystem::path> used;
  for (const SsdEntry& e : done.entries) used.push_back(entry_dir_ / ssd_entry_name(e.header.digest));
  {
    std::lock_guard lock(mutex_);
    for (const SsdEntry& e : done.entries)
      if (auto it = index_.find(e.header.digest); it != index_.end()) it->second.used = now;
    if (!done.entries.empty()) ++stats_.hits;
    stats_.restores += static_cast<int64_t>(done.entries.size());
    stats_.restore_bytes += bytes;
    stats_.restore_seconds += timer.seconds();
    restored_.push_back(std::move(done));
    if (restore_listener_) restore_listener_();  // under the lock, as read_checkpoint's
  }
  // The files' times carry their last use to the next process's LRU: set once the waiting
  // request has its blocks (a metadata write each, no part of the restore).
  for (const std::filesystem::path& path : used) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
}

int64_t SsdTier::clear() {
  std::lock_guard lock(mutex_);
  int64_t n = 0;
  for (const auto& [digest, e] : index_) {
    std::error_code ec;
    if (std::filesystem::remove(entry_dir_ / ssd_entry_name(digest), ec)) ++n;
  }
  index_.clear();
  stats_.entries = 0;
  stats_.bytes = 0;
  return n;
}

SsdStats SsdTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace kettle
