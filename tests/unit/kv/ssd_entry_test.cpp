// The SSD tier's entry file on a real filesystem: written whole (no temporary
// left), aligned for O_DIRECT, read back byte for byte; every damaged header,
// a truncated, empty or foreign file refused; a damaged tensor caught only
// when the reader verifies tensors (the header is always checked).
#include "kv/ssd_entry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "kv/ssd_tier.h"
#include "util/error.h"
#include "support/temp_dir.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;


std::vector<uint8_t> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void put_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

uint32_t u32_at(const std::vector<uint8_t>& bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | bytes[at + static_cast<size_t>(i)];
  return v;
}

struct Written {
  SsdEntryHeader header;
  std::vector<std::vector<uint8_t>> tensors;
  fs::path path;
};

// An entry of two tensors (5000 and 100 bytes: neither a multiple of 4096) written into `dir`.
Written write_example(const fs::path& dir) {
  Written w;
  w.header.identity = {"org/model-7b", "fingerprint-1", "tokenizer-1", "plain 2x8x64 block 16"};
  w.header.scope = 0x1234567890abcdefull;
  w.header.depth = 3;
  w.header.parent = sha256("parent", 6);
  w.header.tokens = {1, -2, 300000, 4, 5, 6, 7, 8};
  w.header.digest = prefix_block_digest(w.header.parent, w.header.tokens);
  w.header.tensors = {{0, 0, 0, 0}, {1, 0, 0, 0}};
  w.tensors = {random_bytes(5000, 1), random_bytes(100, 2)};
  write_ssd_entry(dir, w.header, {w.tensors[0], w.tensors[1]});
  w.path = dir / ssd_entry_name(w.header.digest);
  return w;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SsdEntry, WrittenAndReadBackWhole) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  EXPECT_EQ(w.path.filename().string(), hex(w.header.digest) + ".kv");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{w.path.filename().string()}) << "no temporary file is left behind";

  const uint64_t size = fs::file_size(w.path);
  EXPECT_EQ(size % kSsdAlignment, 0u);
  EXPECT_GE(size, kSsdAlignment + 8192 + 4096) << "the header's page, then 5000 and 100 bytes each padded";

  for (bool verify : {false, true}) {
    const SsdEntry e = read_ssd_entry(w.path, verify);
    EXPECT_EQ(e.header.identity, w.header.identity);
    EXPECT_EQ(e.header.scope, w.header.scope);
    EXPECT_EQ(e.header.depth, w.header.depth);
    EXPECT_EQ(e.header.parent, w.header.parent);
    EXPECT_EQ(e.header.digest, w.header.digest);
    EXPECT_EQ(e.header.tokens, w.header.tokens);
    EXPECT_EQ(e.header.file_bytes, size);
    ASSERT_EQ(e.header.tensors.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(e.header.tensors[i].kind, static_cast<int>(i));
      EXPECT_EQ(e.header.tensors[i].offset % kSsdAlignment, 0u);
      EXPECT_EQ(e.header.tensors[i].bytes, w.tensors[i].size());
      EXPECT_EQ(e.header.tensors[i].checksum, checksum64(w.tensors[i].data(), w.tensors[i].size()));
      const std::span<const uint8_t> t = e.tensor(i);
      EXPECT_EQ(std::vector<uint8_t>(t.begin(), t.end()), w.tensors[i]);
    }
    EXPECT_GE(e.header.tensors[1].offset, e.header.tensors[0].offset + 8192) << "tensors do not overlap";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(e.data.get()) % kSsdAlignment, 0u);
  }
  const SsdEntryHeader h = read_ssd_header(w.path);
  EXPECT_EQ(h.digest, w.header.digest);
  EXPECT_EQ(h.tensors[1].offset, read_ssd_entry(w.path, false).header.tensors[1].offset);
  const std::vector<uint8_t> bytes = file_bytes(w.path);
  EXPECT_EQ(parse_ssd_header({bytes.data(), kSsdAlignment}, "x").digest, w.header.digest)
      << "the first page alone holds the header";
  EXPECT_EQ(std::memcmp(bytes.data(), "KETTLEKV", 8), 0);
  EXPECT_EQ(u32_at(bytes, 8), kSsdVersion);
}

TEST(SsdEntry, AnEntryWithoutTensorsAndAnOverwrite) {
  TempDir dir("kettle_ssd_entry");
  SsdEntryHeader h;
  h.tokens = {9};
  h.digest = prefix_block_digest(h.parent, h.tokens);
  write_ssd_entry(dir.path(), h, {});
  const fs::path path = dir.path() / ssd_entry_name(h.digest);
  EXPECT_EQ(fs::file_size(path), kSsdAlignment);
  EXPECT_TRUE(read_ssd_entry(path, true).header.tensors.empty());
  // The same digest again replaces the file atomically (rename over it).
  h.tensors = {{0, 0, 0, 0}};
  const std::vector<uint8_t> t(4096, 7);
  write_ssd_entry(dir.path(), h, {t});
  EXPECT_EQ(fs::file_size(path), 2 * kSsdAlignment);
  EXPECT_EQ(read_ssd_entry(path, true).header.tensors.size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// Every byte of the preamble and the JSON header, flipped, is refused by both readers and
// whatever `verify` says (checked in memory for every byte, through files for a sample).
TEST(SsdEntry, AFlippedHeaderByteIsRefused) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  const std::vector<uint8_t> good = file_bytes(w.path);
  const size_t header_end = 24 + u32_at(good, 12);
  ASSERT_LT(header_end, kSsdAlignment);
  for (size_t at = 0; at < header_end; ++at)
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = good;
      bad[at] ^= mask;
      EXPECT_THROW(parse_ssd_header({bad.data(), bad.size()}, "bad"), Error) << "byte " << at << " ^ " << int{mask};
    }
  const fs::path copy = dir.path() / "copy.kv";
  for (size_t at :
       {size_t{0}, size_t{8}, size_t{12}, size_t{16}, size_t{24}, size_t{40}, header_end / 2, header_end - 1}) {
    std::vector<uint8_t> bad = good;
    bad[at] ^= 0x20;
    put_file(copy, bad);
    EXPECT_THROW(read_ssd_header(copy), Error) << "byte " << at;
    EXPECT_THROW(read_ssd_entry(copy, false), Error) << "byte " << at;
    EXPECT_THROW(read_ssd_entry(copy, true), Error) << "byte " << at;
  }
  std::vector<uint8_t> bad = good;
  bad[30] ^= 1;
  put_file(copy, bad);
  EXPECT_NE(error_of([&] { read_ssd_entry(copy, false); }).find("checksum"), std::string::npos);
}

// The tensors' checksums are checked only when the reader verifies: without it a flipped
// tensor byte comes back as stored (the documented cost of not verifying; the header is
// always checked).
TEST(SsdEntry, AFlippedTensorByteIsCaughtOnlyWhenVerifying) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  const SsdEntry good = read_ssd_entry(w.path, true);
  for (size_t t = 0; t < 2; ++t) {
    std::vector<uint8_t> bytes = file_bytes(w.path);
    const size_t at = good.header.tensors[t].offset + good.header.tensors[t].bytes - 1;
    bytes[at] ^= 0x04;
    put_file(w.path, bytes);
    const std::string error = error_of([&] { read_ssd_entry(w.path, true); });
    EXPECT_NE(error.find("checksum"), std::string::npos) << "tensor " << t << ": " << error;
    const SsdEntry unverified = read_ssd_entry(w.path, false);  // header-only check: not detected
    std::vector<uint8_t> expected = w.tensors[t];
    expected.back() ^= 0x04;
    const std::span<const uint8_t> back = unverified.tensor(t);
    EXPECT_EQ(std::vector<uint8_t>(back.begin(), back.end()), expected);
    EXPECT_NO_THROW(read_ssd_header(w.path));
    bytes[at] ^= 0x04;
    put_file(w.path, bytes);
    EXPECT_NO_THROW(read_ssd_entry(w.path, true));
  }
}

TEST(SsdEntry, ATruncatedFileIsRefused) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  const std::vector<uint8_t> good = file_bytes(w.path);
  const fs::path copy = dir.path() / "copy.kv";
  for (size_t keep :
       {good.size() - 1, good.size() - 4096, size_t{8192}, size_t{4096}, size_t{100}, size_t{23}, size_t{1}}) {
    put_file(copy, std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    EXPECT_THROW(read_ssd_entry(copy, false), Error) << keep << " bytes kept";
    EXPECT_THROW(read_ssd_entry(copy, true), Error) << keep << " bytes kept";
    if (keep < 24 + u32_at(good, 12)) {
      EXPECT_THROW(read_ssd_header(copy), Error) << keep << " bytes kept";
    }
  }
  std::vector<uint8_t> longer = good;  // trailing bytes are refused too: the size is the header's
  longer.resize(good.size() + 4096);
  put_file(copy, longer);
  EXPECT_THROW(read_ssd_entry(copy, false), Error);
}

TEST(SsdEntry, GarbageEmptyAndMissingFilesAreRefused) {
  TempDir dir("kettle_ssd_entry");
  const fs::path garbage = dir.path() / "garbage.kv", empty = dir.path() / "empty.kv";
  put_file(garbage, random_bytes(3 * 4096, 99));
  put_file(empty, {});
  for (const fs::path& p : {garbage, empty}) {
    EXPECT_THROW(read_ssd_header(p), Error) << p;
    EXPECT_THROW(read_ssd_entry(p, false), Error) << p;
    EXPECT_THROW(read_ssd_entry(p, true), Error) << p;
  }
  std::vector<uint8_t> magic_then_garbage = random_bytes(2 * 4096, 5);
  std::memcpy(magic_then_garbage.data(), "KETTLEKV\x01\0\0\0", 12);
  put_file(garbage, magic_then_garbage);
  EXPECT_THROW(read_ssd_header(garbage), Error);
  EXPECT_THROW(read_ssd_entry(garbage, true), Error);
  try {
    read_ssd_entry(dir.path() / "missing.kv", true);
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kNotFound);
  }
}

TEST(SsdEntry, WrongMagicAndWrongVersionAreRefused) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  const std::vector<uint8_t> good = file_bytes(w.path);
  std::vector<uint8_t> bad = good;
  std::memcpy(bad.data(), "GGUFKVXX", 8);
  put_file(w.path, bad);
  EXPECT_NE(error_of([&] { read_ssd_header(w.path); }).find("magic"), std::string::npos);
  EXPECT_THROW(read_ssd_entry(w.path, false), Error);
  bad = good;
  bad[8] = static_cast<uint8_t>(kSsdVersion + 1);
  put_file(w.path, bad);
  EXPECT_NE(error_of([&] { read_ssd_header(w.path); }).find("version"), std::string::npos);
  EXPECT_NE(error_of([&] { read_ssd_entry(w.path, true); }).find("version"), std::string::npos);
}

// A header that passes its checksum but places a tensor outside the file (written by a
// buggy or hostile writer) is refused by the bounds check, not trusted.
TEST(SsdEntry, AConsistentHeaderThatLiesAboutItsTensorsIsRefused) {
  TempDir dir("kettle_ssd_entry");
  const Written w = write_example(dir.path());
  const std::vector<uint8_t> good = file_bytes(w.path);
  const uint32_t json_bytes = u32_at(good, 12);
  const std::string json(good.begin() + 24, good.begin() + 24 + json_bytes);
  const std::string bytes_field = "\"bytes\":100,";
  ASSERT_NE(json.find(bytes_field), std::string::npos) << json;
  std::string lie = json;
  lie.replace(lie.find(bytes_field), bytes_field.size(), "\"bytes\":1000000,");
  std::vector<uint8_t> bad = good;
  std::fill(bad.begin() + 24, bad.begin() + 4096, uint8_t{0});
  std::memcpy(bad.data() + 24, lie.data(), lie.size());
  const auto size = static_cast<uint32_t>(lie.size());
  for (int i = 0; i < 4; ++i) bad[12 + static_cast<size_t>(i)] = static_cast<uint8_t>(size >> (8 * i));
  // The format's header checksum: checksum64 of the JSON seeded with version << 32 | size.
  const uint64_t sum = checksum64(lie.data(), lie.size(), uint64_t{kSsdVersion} << 32 | size);
  for (int i = 0; i < 8; ++i) bad[16 + static_cast<size_t>(i)] = static_cast<uint8_t>(sum >> (8 * i));
  put_file(w.path, bad);
  const std::string error = error_of([&] { read_ssd_entry(w.path, false); });
  EXPECT_NE(error.find("outside the file"), std::string::npos) << error;
}

TEST(SsdEntry, WritingIntoAMissingDirectoryThrowsSystemError) {
  TempDir dir("kettle_ssd_entry");
  SsdEntryHeader h;
  h.tokens = {1, 2};
  h.digest = prefix_block_digest(h.parent, h.tokens);
  h.tensors = {{0, 0, 0, 0}};
  const std::vector<uint8_t> t(10, 1);
  try {
    write_ssd_entry(dir.path() / "no" / "such" / "dir", h, {t});
    ADD_FAILURE() << "wrote into a directory that does not exist";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT) << e.what();
  }
  EXPECT_THROW(write_ssd_entry(dir.path(), h, {}), Error) << "one tensor named, none given";
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

}  // namespace
}  // namespace kettle
