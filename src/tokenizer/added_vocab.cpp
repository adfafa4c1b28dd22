// Added-token matching: a byte trie per token set (plain / normalized) scanned
// leftmost-longest like HF's Aho-Corasick, then HF's find_matches rules.
#include "tokenizer/added_vocab.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::tok {

using nlohmann::json;

void AddedVocab::Trie::add(std::string_view content, int32_t token_index) {
  if (content.empty()) return;
  if (terminal.empty()) root.fill(-1);
  auto new_node = [&] {
    terminal.push_back(-1);
    return static_cast<int32_t>(terminal.size() - 1);
  };
  auto b0 = static_cast<unsigned char>(content[0]);
  if (root[b0] < 0) root[b0] = new_node();
  int32_t node = root[b0];
  for (size_t i = 1; i < content.size(); ++i) {
    const uint64_t key = (uint64_t(uint32_t(node)) << 8) | static_cast<unsigned char>(content[i]);
    auto it = edges.find(key);
    if (it == edges.end()) it = edges.emplace(key, new_node()).first;
    node = it->second;
  }
  // A duplicate content keeps the first token, as HF's map from content does.
  if (terminal[static_cast<size_t>(node)] < 0) terminal[static_cast<size_t>(node)] = token_index;
}

bool AddedVocab::Trie::longest_at(std::string_view text, size_t i, size_t& end, int32_t& token_index) const {
  int32_t node = root[static_cast<unsigned char>(text[i])];
  bool found = false;
  for (size_t j = i + 1;; ++j) {
    if (terminal[static_cast<size_t>(node)] >= 0) {
      found = true;
      end = j;
      token_index = terminal[static_cast<size_t>(node)];
    }
    if (j >= text.size()) break;
    const uint64_t key = (uint64_t(uint32_t(node)) << 8) | static_cast<unsigned char>(text[j]);
    auto it = edges.find(key);
    if (it == edges.end()) break;
    node = it->second;
  }
  return found;
}

AddedVocab::AddedVocab(const json& added_tokens, const Normalizer* normalizer, const std::string& where) {
  if (added_tokens.is_null()) return;
  for (const json& t : added_tokens) {
    AddedToken tok;
    tok.content = t.at("content").get<std::string>();
    tok.id = t.at("id").get<int32_t>();
    tok.special = t.value("special", false);
    tok.normalized = t.value("normalized", !tok.special);
    tok.lstrip = t.value("lstrip", false);
    tok.rstrip = t.value("rstrip", false);
    tok.single_word = t.value("single_word", false);
    if (tok.id < 0) fail(ErrorCategory::kInvalidData, "{}: added token \"{}\" has a negative id", where, tok.content);
    max_id_ = std::max(max_id_, tok.id);
    by_id_.emplace(tok.id, tokens_.size());
    by_content_.emplace(tok.content, tok.id);
    if (tok.special) special_contents_.insert(tok.content);
    tokens_.push_back(std::move(tok));
  }
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& tok = tokens_[k];
    if (!tok.normalized) {
      plain_.add(tok.content, static_cast<int32_t>(k));
    } else {
      std::string content = tok.content;
      if (normalizer != nullptr) normalizer->normalize(content);
      normalized_.add(content, static_cast<int32_t>(k));
    }
  }
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocab::id_of(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

bool AddedVocab::is_special_content(std::string_view content) const {
  return special_contents_.count(std::string(content)) > 0;
}

namespace {

// The regex crate's ^\w / \w$ and ^\s* / \s*$ used by find_matches.
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t end = s.size();
  return unicode::is_word_char(unicode::prev_char(s, end));
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return unicode::is_word_char(unicode::next_char(s, i));
}
size_t leftmost_space_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t e = end;
    if (!unicode::is_whitespace(unicode::prev_char(s, e))) break;
    end = e;
  }
  return end;
}
size_t rightmost_space_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!unicode::is_whitespace(unicode::next_char(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedVocab::split(std::string_view text, bool normalized, std::vector<Segment>& out) const {
  const Trie& trie = normalized ? normalized_ : plain_;
  const auto n = static_cast<uint32_t>(text.size());
  if (trie.empty()) {
    if (n > 0) out.push_back(Segment{0, n, -1});
    return;
  }
  uint32_t start_offset = 0;
  for (size_t i = 0; i < text.size();) {
    size_t stop = 0;
    int32_t index = -1;
    if (trie.root[static_cast<unsigned char>(text[i])] < 0 || !trie.longest_at(text, i, stop, index)) {
      ++i;
      continue;
    }
    const size_t match_start = i;
    i = stop;  // the automaton resumes after the raw match, whatever stripping does
    const AddedToken& tok = tokens_[static_cast<size_t>(index)];
    size_t start = match_start;
    if (tok.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max<size_t>(leftmost_space_at_end(text.substr(0, start)), start_offset);
    if (tok.rstrip) stop += rightmost_space_at_start(text.substr(stop));
    if (start_offset < start) out.push_back(Segment{start_offset, static_cast<uint32_t>(start), -1});
    out.push_back(Segment{static_cast<uint32_t>(start), static_cast<uint32_t>(stop), tok.id});
    start_offset = static_cast<uint32_t>(stop);
  }
  if (start_offset < n) out.push_back(Segment{start_offset, n, -1});
}

}  // namespace kettle::tok
