// One cached prefix block on disk (the SSD tier's entry file): who may read it
// (model, weights and tokenizer fingerprints, the KV layout and codec), where it
// sits in a prefix (the digest of everything before it, its scope, its depth,
// the token ids of its block), and its tensors (one pool block per kind, as
// KvPool::read_block gives them), each with a checksum.
//
//   0   "KETTLEKV"   8 bytes
//   8   version      u32 little-endian (1)
//   12  header size  u32: the JSON header's bytes
//   16  checksum     u64: checksum64 of the JSON header, seeded with version and size
//   24  header       JSON
//   ... zeros to a multiple of 4096, then each tensor at its 4096-aligned offset, padded
//       to 4096 (the whole file reads with O_DIRECT)
//
// An entry is written to a temporary name in its directory, fsync'd, renamed to its
// digest's name and the directory fsync'd: a reader sees a whole entry or none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/digest.h"

namespace kettle {

// Whose KV an entry holds: a file whose identity differs is foreign (never loaded).
struct SsdIdentity {
  std::string model_id;
  std::string model_fingerprint;  // config and weights (their headers)
  std::string tokenizer_hash;
  std::string kv_layout;          // every layer's kind, window and codec; block size; ranks
  bool operator==(const SsdIdentity&) const = default;
};

struct SsdTensor {
  int kind = 0;          // KvPool kind
  uint64_t offset = 0;   // in the file, a multiple of 4096
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

struct SsdEntryHeader {
  SsdIdentity identity;
  uint64_t scope = 0;
  int64_t depth = 0;  // blocks before this one in its prefix
  Sha256Digest parent{}, digest{};
  std::vector<int32_t> tokens;  // this block's
  std::vector<SsdTensor> tensors;
  uint64_t file_bytes = 0;      // the whole file, padding included
};

constexpr size_t kSsdAlignment = 4096;
constexpr uint32_t kSsdVersion = 1;

// The name an entry's file has in its directory.
std::string ssd_entry_name(const Sha256Digest& digest);
// What this process's temporary files carry in their names (random per process, so a
// scan tells its own writes under way from what a crashed process left, even one that
// had the same pid).
const std::string& ssd_temporary_tag();

// Writes header + tensors (tensors[i] is header.tensors[i]'s bytes; offsets, checksums
// and the file size are filled in here) atomically and durably into `dir`. Throws
// std::system_error (its errno: ENOSPC, EROFS, ...) when the disk refuses.
void write_ssd_entry(const std::filesystem::path& dir, SsdEntryHeader header,
                     const std::vector<std::span<const uint8_t>>& tensors);

// Writes `pieces` one after another as dir/name, atomically and durably (a temporary
// name, fsync, rename, directory fsync). Throws std::system_error.
void write_file_atomically(const std::filesystem::path& dir, const std::string& name,
                           const std::vector<std::span<const uint8_t>>& pieces);

// Parses and checks the start of an entry file (at least its first kSsdAlignment bytes,
// or the whole file): magic, version, header checksum, JSON. Throws kettle::Error
// (kInvalidData) naming what is wrong.
SsdEntryHeader parse_ssd_header(std::span<const uint8_t> start, const std::string& name);

// Reads the header of the file at `path` (the scan at start).
SsdEntryHeader read_ssd_header(const std::filesystem::path& path);

// A whole entry read back: its header and each tensor's bytes. The header checksum is
// always checked, the tensors' when `verify`; the file's size must be the header's.
// Reads with O_DIRECT where the filesystem allows it. Throws kettle::Error (kInvalidData
// or kNotFound).
struct SsdEntry {
  SsdEntryHeader header;
  std::shared_ptr<uint8_t> data;  // the file, read into 4096-aligned memory
  std::span<const uint8_t> tensor(size_t i) const {
    return {data.get() + header.tensors[i].offset, header.tensors[i].bytes};
  }
};
SsdEntry read_ssd_entry(const std::filesystem::path& path, bool verify);

}  // namespace kettle
