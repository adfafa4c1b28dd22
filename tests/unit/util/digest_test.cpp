// SHA-256 against FIPS 180-4's published vectors and coreutils' sha256sum (an
// independent implementation) on random messages fed in random pieces, across
// the padding edges; checksum64's properties: independent of the buffer's
// alignment, changed by any single flipped bit, changed by its seed.
#include "util/digest.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kettle {
namespace {

std::string sha256_hex(const std::string& text) {
  return hex(sha256(text.data(), text.size()));
}

// FIPS 180-4 / NIST's "Secure Hashing" example values (SHA256.pdf, SHA2_Additional.pdf).
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 pieces;  // the same million fed 1000 bytes at a time
  for (int i = 0; i < 1000; ++i) pieces.update(million.data(), 1000);
  EXPECT_EQ(hex(pieces.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, HexSpellsEveryByteAsTwoLowercaseDigits) {
  const std::vector<uint8_t> bytes = {0x00, 0x01, 0x0f, 0x10, 0xab, 0xff};
  EXPECT_EQ(hex(bytes), "00010f10abff");
  EXPECT_EQ(hex(std::span<const uint8_t>()), "");
}

// coreutils' sha256sum of `bytes`, written to a temporary file.
std::string sha256sum(const std::vector<uint8_t>& bytes, const std::filesystem::path& file) {
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string command = "sha256sum '" + file.string() + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  char line[256] = {};
  const bool read = std::fgets(line, sizeof line, pipe) != nullptr;
  const int status = ::pclose(pipe);
  if (!read || status != 0) return "sha256sum failed";
  return std::string(line).substr(0, 64);
}

// The digest of `bytes` fed to update() in random pieces (empty ones included).
std::string hashed_in_pieces(const std::vector<uint8_t>& bytes, std::mt19937& rng) {
  Sha256 h;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t left = bytes.size() - at;
    // Mostly small pieces (to cross the 64-byte buffer at every offset), sometimes large ones.
    const size_t cap = rng() % 4 == 0 ? left : std::min<size_t>(left, 70);
    const size_t n = std::uniform_int_distribution<size_t>(0, cap)(rng);
    h.update(bytes.data() + at, n);
    at += n;
  }
  if (rng() % 2) h.update(bytes.data(), 0);
  return hex(h.finish());
}

TEST(Sha256, AgreesWithCoreutilsOnRandomMessagesInRandomPieces) {
  if (std::system("command -v sha256sum > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "coreutils' sha256sum is not installed";
  char dir_template[] = "/tmp/kettle_digest_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir = dir_template;
  std::mt19937 rng(20240611);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);  // 55/56/64, 119/120/128, ... all crossed
  for (size_t n : std::vector<size_t>{511, 512, 513, 1000, 4095, 4096, 4097, 65535, 65536 + 55, (size_t{1} << 20) + 3})
    lengths.push_back(n);
  for (size_t n : lengths) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string expected = sha256sum(bytes, dir / "message");
    ASSERT_EQ(expected.size(), 64u) << expected;
    EXPECT_EQ(hex(sha256(bytes.data(), bytes.size())), expected) << n << " bytes in one piece";
    EXPECT_EQ(hashed_in_pieces(bytes, rng), expected) << n << " bytes in random pieces";
  }
  std::filesystem::remove_all(dir);
}

// The message bytes at every alignment in a buffer give the same checksum.
TEST(Checksum64, EqualBytesEqualChecksumsAtAnyAlignment) {
  std::mt19937 rng(7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, size_t{32}, size_t{33},
                   size_t{63}, size_t{64}, size_t{100}, size_t{4096}, size_t{4099}}) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const uint64_t reference = checksum64(bytes.data(), n, 5);
    std::vector<uint8_t> buffer(n + 16);
    for (size_t offset = 0; offset < 16; ++offset) {
      std::fill(buffer.begin(), buffer.end(), static_cast<uint8_t>(offset * 37 + 1));
      std::memcpy(buffer.data() + offset, bytes.data(), n);
      EXPECT_EQ(checksum64(buffer.data() + offset, n, 5), reference) << n << " bytes at offset " << offset;
    }
  }
}

TEST(Checksum64, EverySingleFlippedBitChangesIt) {
  std::mt19937 rng(11);
  std::vector<uint8_t> small(200);
  for (auto& b : small) b = static_cast<uint8_t>(rng());
  const uint64_t base = checksum64(small.data(), small.size());
  std::set<uint64_t> seen = {base};
  for (size_t bit = 0; bit < small.size() * 8; ++bit) {
    small[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    const uint64_t flipped = checksum64(small.data(), small.size());
    EXPECT_NE(flipped, base) << "bit " << bit;
    seen.insert(flipped);
    small[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(seen.size(), small.size() * 8 + 1) << "no two single-bit flips collide";
  EXPECT_EQ(checksum64(small.data(), small.size()), base);

  for (size_t n : {size_t{4096}, size_t{65536 + 13}}) {
    std::vector<uint8_t> big(n);
    for (auto& b : big) b = static_cast<uint8_t>(rng());
    const uint64_t big_base = checksum64(big.data(), big.size());
    std::vector<size_t> bits = {0, n * 8 - 1};  // the ends, then random positions
    for (int i = 0; i < 2000; ++i) bits.push_back(rng() % (n * 8));
    for (size_t bit : bits) {
      big[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      EXPECT_NE(checksum64(big.data(), big.size()), big_base) << n << " bytes, bit " << bit;
      big[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

TEST(Checksum64, LengthAndSeedMatter) {
  std::vector<uint8_t> zeros(64, 0);
  std::set<uint64_t> by_length;
  for (size_t n = 0; n <= 64; ++n) by_length.insert(checksum64(zeros.data(), n));
  EXPECT_EQ(by_length.size(), 65u) << "runs of zeros of different lengths differ";
  const std::string text = "kettle";
  std::set<uint64_t> by_seed;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{1} << 32, ~uint64_t{0}})
    by_seed.insert(checksum64(text.data(), text.size(), seed));
  EXPECT_EQ(by_seed.size(), 5u);
  std::vector<uint8_t> block(4096, 0xa5);
  EXPECT_NE(checksum64(block.data(), block.size(), 0), checksum64(block.data(), block.size(), 1));
  EXPECT_EQ(checksum64(block.data(), block.size(), 3), checksum64(block.data(), block.size(), 3));
}

}  // namespace
}  // namespace kettle
