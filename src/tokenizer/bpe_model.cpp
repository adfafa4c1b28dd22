// BPE encoding as HF tokenizers' models/bpe does it: the word is split into
// characters (raw bytes for byte-level models), byte-fallback / unk rules
// applied, then merged pair by pair in rank order; results are cached per word.
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>

#include "tokenizer/components.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::tok {

using nlohmann::json;

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  shift_ = 60;
  while (cap < n * 2) {
    cap <<= 1;
    --shift_;
  }
  entries_.assign(cap, Entry{});
  mask_ = cap - 1;
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t id) {
  const uint64_t key = pack(left, right);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key || e.key == kEmpty) {
      e = Entry{key, rank, id};
      return;
    }
  }
}

namespace {

std::string optional_string(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return {};
  return j[key].get<std::string>();
}

// The raw bytes a byte-level token stands for; nullopt when it has a character
// outside the byte alphabet (such tokens can never come out of byte-level BPE).
std::optional<std::string> unmap_bytes(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const int b = byte_from_unicode(unicode::next_char(token, i));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace

BpeModel::BpeModel(const json& model, const std::string& where, bool byte_level)
    : byte_level_(byte_level), where_(where) {
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0.0)
    fail(ErrorCategory::kUnsupported, "{}: BPE dropout is not supported (inference only)", where);
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  prefix_ = optional_string(model, "continuing_subword_prefix");
  suffix_ = optional_string(model, "end_of_word_suffix");

  const json& vocab = model.at("vocab");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    if (id < 0) fail(ErrorCategory::kInvalidData, "{}: vocab token \"{}\" has a negative id", where, token);
    vocab_[token] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = token;

  const std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) fail(ErrorCategory::kInvalidData, "{}: unk_token \"{}\" is not in the vocab", where, unk);
    unk_id_ = it->second;
  }
  fallback_ids_.fill(-1);
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
      if (it != vocab_.end()) fallback_ids_[static_cast<size_t>(b)] = it->second;
    }
  }
  byte_ids_.fill(-1);
  if (byte_level_) {
    byte_vocab_.reserve(vocab_.size());
    for (const auto& [token, id] : vocab_)
      if (auto raw = unmap_bytes(token)) byte_vocab_.emplace(std::move(*raw), id);
    for (int b = 0; b < 256; ++b) {
      auto it = vocab_.find(byte_to_unicode(static_cast<unsigned char>(b)));
      if (it != vocab_.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
    }
  }

  if (!byte_level_ && prefix_.empty() && suffix_.empty()) {
    char_ids_.assign(kCharTable, -1);
    for (const auto& [token, id] : vocab_) {
      size_t i = 0;
      if (token.empty()) continue;
      const char32_t c = unicode::next_char(token, i);
      if (i == token.size() && c < kCharTable) char_ids_[c] = id;
    }
  }

  const json& merges = model.at("merges");
  merges_.reserve(merges.size());
  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = vocab_.find(token);
    if (it == vocab_.end())
      fail(ErrorCategory::kInvalidData, "{}: merge {} uses \"{}\", which is not in the vocab", where, rank, token);
    return it->second;
  };
  std::string left, right, merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        fail(ErrorCategory::kInvalidData, "{}: merge {} (\"{}\") is not two tokens separated by a space", where, rank,
             line);
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail(ErrorCategory::kInvalidData, "{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", where, rank);
    }
    // With a continuing-subword prefix the right part loses it when merged.
    merged = left;
    if (!prefix_.empty() && right.starts_with(prefix_))
      merged.append(right, prefix_.size());
    else
      merged += right;
    merges_.insert(id_of(left, rank), id_of(right, rank), static_cast<uint32_t>(rank), id_of(merged, rank));
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return nullptr;
  const std::string& t = id_to_token_[static_cast<size_t>(id)];
  return t.empty() ? nullptr : &t;
}

// HF merge_word: one symbol per character; unknown characters become byte
// fallback tokens, or unk (fused into the previous unk when fuse_unk).
void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& syms) const {
  syms.clear();
  int32_t unk_len = -1;  // pending unk symbol's byte length, -1 when none
  auto add = [&](int32_t id, uint32_t len) {
    syms.push_back(Symbol{id, static_cast<int32_t>(syms.size()) - 1, static_cast<int32_t>(syms.size()) + 1, len});
  };
  std::string scratch;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += byte_level_ ? 1 : unicode::seq_len(static_cast<unsigned char>(word[i]));
    const std::string_view ch = word.substr(start, i - start);
    const auto byte_len = static_cast<uint32_t>(ch.size());
    int32_t id = -1;
    if (byte_level_) {
      id = byte_ids_[static_cast<unsigned char>(ch[0])];
    } else if (!char_ids_.empty()) {
      size_t k = 0;
      const char32_t c = unicode::next_char(ch, k);
      if (c < kCharTable) {
        id = char_ids_[c];
      } else {
        auto it = vocab_.find(ch);
        if (it != vocab_.end()) id = it->second;
      }
    } else {
      scratch.clear();
      if (start > 0) scratch += prefix_;
      scratch += ch;
      if (i == word.size()) scratch += suffix_;
      auto it = vocab_.find(scratch);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (unk_len >= 0) {
        add(unk_id_, static_cast<uint32_t>(unk_len));
        unk_len = -1;
      }
      add(id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      // HF looks up every byte of the (prefixed) string; all must exist.
      const std::string_view bytes = (prefix_.empty() && suffix_.empty()) ? ch : std::string_view(scratch);
      bool all = true;
      for (char b : bytes) all = all && fallback_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : bytes) add(fallback_ids_[static_cast<unsigned char>(b)], 1);
        continue;
      }
    }
    if (unk_id_ < 0)
      fail(ErrorCategory::kInvalidArgument, "{}: input character \"{}\" is not in the vocab and there is no unk_token",
           where_, std::string(ch));
    if (unk_len >= 0 && fuse_unk_) {
      unk_len += static_cast<int32_t>(byte_len);
    } else {
      if (unk_len >= 0) add(unk_id_, static_cast<uint32_t>(unk_len));
      unk_len = static_cast<int32_t>(byte_len);
    }
  }
  if (unk_len >= 0) add(unk_id_, static_cast<uint32_t>(unk_len));
  if (!syms.empty()) syms.back().next = -1;
}

// Short words: repeatedly merge the lowest-ranked adjacent pair (leftmost on
// ties) — the same order HF's heap produces, without the heap.
void BpeModel::merge_short(std::vector<Symbol>& syms) const {
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  uint32_t ranks[64];
  int32_t merged[64];
  size_t n = syms.size();
  auto pair_rank = [&](size_t k) {
    const MergeTable::Entry* e = merges_.find(syms[k].id, syms[k + 1].id);
    ranks[k] = e ? e->rank : kNone;
    merged[k] = e ? e->id : -1;
  };
  for (size_t k = 0; k + 1 < n; ++k) pair_rank(k);
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k)
      if (ranks[k] < ranks[best]) best = k;
    if (ranks[best] == kNone) break;
    syms[best].id = merged[best];
    syms[best].len += syms[best + 1].len;
    for (size_t k = best + 1; k + 1 < n; ++k) {
      syms[k] = syms[k + 1];
      ranks[k] = ranks[k + 1];
      merged[k] = merged[k + 1];
    }
    --n;
    if (best + 1 < n) pair_rank(best);
    if (best > 0) pair_rank(best - 1);
  }
  syms.resize(n);
}

// Long words: HF's algorithm proper — a min-heap of (rank, position) over a
// linked list of symbols, skipping entries that went stale.
void BpeModel::merge_long(std::vector<Symbol>& syms) const {
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> storage;
  storage.reserve(syms.size());
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue(std::greater<Cand>{}, std::move(storage));
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (const auto* e = merges_.find(syms[k].id, syms[k + 1].id))
      queue.push(Cand{e->rank, static_cast<int32_t>(k), e->id});
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Symbol& cur = syms[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    Symbol& right = syms[static_cast<size_t>(cur.next)];
    const auto* e = merges_.find(cur.id, right.id);
    if (e == nullptr || e->id != top.id) continue;
    cur.id = top.id;
    cur.len += right.len;
    right.len = 0;
    cur.next = right.next;
    if (cur.next >= 0) syms[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* p = merges_.find(syms[static_cast<size_t>(cur.prev)].id, cur.id))
        queue.push(Cand{p->rank, cur.prev, p->id});
    if (cur.next >= 0)
      if (const auto* q = merges_.find(cur.id, syms[static_cast<size_t>(cur.next)].id))
        queue.push(Cand{q->rank, top.pos, q->id});
  }
  std::erase_if(syms, [](const Symbol& s) { return s.len == 0; });
}

void BpeModel::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> syms;
  initial_symbols(word, syms);
  if (syms.size() <= 64)
    merge_short(syms);
  else
    merge_long(syms);
  for (const Symbol& s : syms) out.push_back(s.id);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const StringMap& map = byte_level_ ? byte_vocab_ : vocab_;
    auto it = map.find(word);
    if (it != map.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kCacheMaxWord) {
    tokenize_uncached(word, out);
    return;
  }
  const size_t h = StringHash{}(word);
  CacheShard& shard = cache_[(h >> 7) % kCacheShards];
  {
    std::lock_guard lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  tokenize_uncached(word, out);
  std::lock_guard lock(shard.mu);
  if (shard.map.size() < kCacheShardCapacity)
    shard.map.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(first), out.end()));
}

}  // namespace kettle::tok
