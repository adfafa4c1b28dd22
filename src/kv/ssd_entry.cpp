// Entry files: the JSON header behind a fixed preamble, tensors at aligned
// offsets; written whole under a temporary name and renamed, read whole (with
// O_DIRECT where allowed) and checked before anything of it is used.
#include "kv/ssd_entry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>

#include "util/error.h"

namespace kettle {
namespace {

constexpr char kMagic[8] = {'K', 'E', 'T', 'T', 'L', 'E', 'K', 'V'};
constexpr size_t kPreamble = 24;
constexpr size_t kMaxHeaderBytes = 1 << 20;

size_t aligned(size_t n) { return (n + kSsdAlignment - 1) / kSsdAlignment * kSsdAlignment; }

uint64_t header_checksum(const uint8_t* json, uint32_t bytes) {
  return checksum64(json, bytes, uint64_t{kSsdVersion} << 32 | bytes);
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

[[noreturn]] void system_failure(const std::string& what) { throw std::system_error(errno, std::generic_category(), what); }

void write_all(int fd, const uint8_t* p, size_t n, const std::string& name) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) system_failure("writing " + name);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) system_failure("opening " + dir.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) system_failure("fsync of " + dir.string());
}

std::string digest_hex(const Sha256Digest& d) { return hex(d); }

Sha256Digest digest_from_hex(const std::string& text, const std::string& name) {
  Sha256Digest d{};
  if (!parse_hex_digest(text, d)) fail(ErrorCategory::kInvalidData, "{}: a digest is 64 hex digits", name);
  return d;
}

nlohmann::json header_json(const SsdEntryHeader& h) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const SsdTensor& t : h.tensors)
    tensors.push_back({{"kind", t.kind}, {"offset", t.offset}, {"bytes", t.bytes}, {"checksum", t.checksum}});
  return {{"model_id", h.identity.model_id},
          {"model_fingerprint", h.identity.model_fingerprint},
          {"tokenizer_hash", h.identity.tokenizer_hash},
          {"kv_layout", h.identity.kv_layout},
          {"scope", h.scope},
          {"depth", h.depth},
          {"parent", digest_hex(h.parent)},
          {"digest", digest_hex(h.digest)},
          {"tokens", h.tokens},
          {"tensors", tensors},
          {"file_bytes", h.file_bytes}};
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

std::shared_ptr<uint8_t> aligned_bytes(size_t n) {
  void* p = std::aligned_alloc(kSsdAlignment, aligned(std::max<size_t>(n, 1)));
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), FreeDeleter{});
}

// Opens for reading, O_DIRECT where the filesystem takes it (tmpfs does not).
int open_for_reading(const std::filesystem::path& path, bool& direct) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(errno == ENOENT ? ErrorCategory::kNotFound : ErrorCategory::kInvalidData, "{}: {}", path.string(),
                   std::strerror(errno));
  return fd;
}

// Reads [0, n) of fd into p (n a multiple of 4096 under O_DIRECT); returns the bytes read.
size_t read_up_to(int fd, uint8_t* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

}  // namespace

std::string ssd_entry_name(const Sha256Digest& digest) { return digest_hex(digest) + ".kv"; }

const std::string& ssd_temporary_tag() {
  static const std::string tag = [] {
    std::random_device random;
    return fmt::format("{}-{:08x}{:08x}", ::getpid(), random(), random());
  }();
  return tag;
}

void write_ssd_entry(const std::filesystem::path& dir, SsdEntryHeader header,
                     const std::vector<std::span<const uint8_t>>& tensors) {
  if (tensors.size() != header.tensors.size())
    fail(ErrorCategory::kInternal, "an SSD entry names {} tensors but {} were given", header.tensors.size(), tensors.size());
  // The header's size depends on the offsets it records: lay them out after a first sizing.
  uint64_t offset = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const std::string json = header_json(header).dump();
    offset = aligned(kPreamble + json.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      header.tensors[i].offset = offset;
      header.tensors[i].bytes = tensors[i].size();
      header.tensors[i].checksum = checksum64(tensors[i].data(), tensors[i].size());
      offset += aligned(tensors[i].size());
    }
    header.file_bytes = offset;
  }
  const std::string json = header_json(header).dump();
  if (aligned(kPreamble + json.size()) != (tensors.empty() ? header.file_bytes : header.tensors[0].offset))
    fail(ErrorCategory::kInternal, "an SSD entry's header changed size as it was laid out");

  std::vector<uint8_t> head(aligned(kPreamble + json.size()), 0);
  std::memcpy(head.data(), kMagic, 8);
  put_u32(head.data() + 8, kSsdVersion);
  put_u32(head.data() + 12, static_cast<uint32_t>(json.size()));
  put_u64(head.data() + 16, header_checksum(reinterpret_cast<const uint8_t*>(json.data()), static_cast<uint32_t>(json.size())));
  std::memcpy(head.data() + kPreamble, json.data(), json.size());

  static const std::vector<uint8_t> zeros(kSsdAlignment, 0);
  std::vector<std::span<const uint8_t>> pieces{head};
  for (const auto& t : tensors) {
    pieces.push_back(t);
    pieces.emplace_back(zeros.data(), aligned(t.size()) - t.size());
  }
  write_file_atomically(dir, ssd_entry_name(header.digest), pieces);
}

void write_file_atomically(const std::filesystem::path& dir, const std::string& name,
                           const std::vector<std::span<const uint8_t>>& pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path temporary = dir / fmt::format(".{}.{}.{}.tmp", name, ssd_temporary_tag(), counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) system_failure("creating " + temporary.string());
  try {
    for (const auto& piece : pieces) write_all(fd, piece.data(), piece.size(), temporary.string());
    if (::fsync(fd) != 0) system_failure("fsync of " + temporary.string());
    ::close(fd);
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), (dir / name).c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    errno = error;
    system_failure("renaming " + temporary.string());
  }
  fsync_directory(dir);
}

SsdEntryHeader parse_ssd_header(std::span<const uint8_t> start, const std::string& name) {
  if (start.size() < kPreamble || std::memcmp(start.data(), kMagic, 8) != 0)
    fail(ErrorCategory::kInvalidData, "{}: not a kettle KV entry (no KETTLEKV magic)", name);
  const uint32_t version = get_u32(start.data() + 8);
  if (version != kSsdVersion) fail(ErrorCategory::kInvalidData, "{}: entry version {}, this kettle reads {}", name, version, kSsdVersion);
  const uint32_t bytes = get_u32(start.data() + 12);
  if (bytes > kMaxHeaderBytes || kPreamble + bytes > start.size())
    fail(ErrorCategory::kInvalidData, "{}: header of {} bytes runs past the file", name, bytes);
  const uint8_t* json = start.data() + kPreamble;
  if (header_checksum(json, bytes) != get_u64(start.data() + 16))
    fail(ErrorCategory::kInvalidData, "{}: header checksum mismatch", name);
  SsdEntryHeader h;
  try {
    const nlohmann::json j = nlohmann::json::parse(json, json + bytes);
    h.identity = {j.at("model_id"), j.at("model_fingerprint"), j.at("tokenizer_hash"), j.at("kv_layout")};
    h.scope = j.at("scope");
    h.depth = j.at("depth");
    h.parent = digest_from_hex(j.at("parent"), name);
    h.digest = digest_from_hex(j.at("digest"), name);
    h.tokens = j.at("tokens").get<std::vector<int32_t>>();
    h.file_bytes = j.at("file_bytes");
    for (const auto& t : j.at("tensors"))
      h.tensors.push_back({t.at("kind"), t.at("offset"), t.at("bytes"), t.at("checksum")});
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{}: malformed header: {}", name, e.what());
  }
  uint64_t end = aligned(kPreamble + bytes);
  for (const SsdTensor& t : h.tensors) {
    if (t.offset % kSsdAlignment != 0 || t.offset < end || t.bytes > h.file_bytes || t.offset > h.file_bytes - t.bytes)
      fail(ErrorCategory::kInvalidData, "{}: a tensor at {} of {} bytes lies outside the file", name, t.offset, t.bytes);
    end = t.offset + aligned(t.bytes);
  }
  return h;
}

SsdEntryHeader read_ssd_header(const std::filesystem::path& path) {
  bool direct = false;
  const int fd = open_for_reading(path, direct);
  auto buffer = aligned_bytes(2 * kSsdAlignment);
  size_t n = read_up_to(fd, buffer.get(), 2 * kSsdAlignment);
  uint32_t bytes = n >= kPreamble ? get_u32(buffer.get() + 12) : 0;
  if (n == 2 * kSsdAlignment && kPreamble + bytes > n && bytes <= kMaxHeaderBytes) {  // a long header
    buffer = aligned_bytes(aligned(kPreamble + bytes));
    n = read_up_to(fd, buffer.get(), aligned(kPreamble + bytes));
  }
  ::close(fd);
  return parse_ssd_header({buffer.get(), n}, path.filename().string());
}

SsdEntry read_ssd_entry(const std::filesystem::path& path, bool verify) {
  bool direct = false;
  const int fd = open_for_reading(path, direct);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(ErrorCategory::kInvalidData, "{}: {}", path.string(), std::strerror(errno));
  }
  const auto size = static_cast<size_t>(st.st_size);
  SsdEntry entry;
  entry.data = aligned_bytes(size);
  size_t n = read_up_to(fd, entry.data.get(), aligned(size));
  ::close(fd);
  const std::string name = path.filename().string();
  if (n != size) fail(ErrorCategory::kInvalidData, "{}: read {} of its {} bytes", name, n, size);
  entry.header = parse_ssd_header({entry.data.get(), size}, name);
  if (entry.header.file_bytes != size)
    fail(ErrorCategory::kInvalidData, "{}: {} bytes, its header says {}", name, size, entry.header.file_bytes);
  if (verify)
    for (size_t i = 0; i < entry.header.tensors.size(); ++i) {
      const std::span<const uint8_t> t = entry.tensor(i);
      if (checksum64(t.data(), t.size()) != entry.header.tensors[i].checksum)
        fail(ErrorCategory::kInvalidData, "{}: tensor {} checksum mismatch", name, i);
    }
  return entry;
}

}  // namespace kettle
