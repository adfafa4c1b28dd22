// The BPE model of tokenizer.json: vocab, ranked merges, byte fallback, unk and
// the word → ids cache. Reproduces HF's Word::merge_all exactly (lowest rank
// first, leftmost on ties).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kettle::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map from a token-id pair to (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n);
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t id);  // a later insert of a pair wins, as in HF
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_; }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // `byte_level`: words arrive as raw bytes (the ByteLevel pre-tokenizer left them
  // unmapped), so the vocab is indexed by the bytes each token stands for.
  BpeModel(const nlohmann::json& model, const std::string& where, bool byte_level);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id has no vocab entry
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }
  // Whether any vocab token is byte-fallback "<0xHH>" (decoders hold such bytes).
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes of the word this symbol covers; 0 once merged away
  };
  void initial_symbols(std::string_view word, std::vector<Symbol>& syms) const;
  void merge_short(std::vector<Symbol>& syms) const;
  void merge_long(std::vector<Symbol>& syms) const;
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;

  StringMap vocab_;       // token text → id (as in tokenizer.json)
  StringMap byte_vocab_;  // byte_level only: raw bytes → id
  std::vector<std::string> id_to_token_;
  MergeTable merges_;
  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::string prefix_, suffix_;              // continuing_subword_prefix, end_of_word_suffix
  std::array<int32_t, 256> byte_ids_{};      // byte_level: id of each single byte
  std::array<int32_t, 256> fallback_ids_{};  // id of "<0xHH>" or -1
  // Single-character tokens by code point (below kCharTable), so the per-char
  // lookup of SentencePiece-style models skips the string hash.
  static constexpr char32_t kCharTable = 0x30000;
  std::vector<int32_t> char_ids_;
  std::string where_;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheShardCapacity = 8192;
  static constexpr size_t kCacheMaxWord = 256;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace kettle::tok
