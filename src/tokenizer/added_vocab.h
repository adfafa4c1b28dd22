// Added tokens (special or not) and how HF splits them out of the text before
// normalization and pre-tokenization: leftmost-longest matching with the
// single_word / lstrip / rstrip rules of AddedVocabulary::find_matches.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/components.h"

namespace kettle::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One part of a split: an added token (id ≥ 0) or plain text (id = -1).
struct Segment {
  uint32_t begin, end;
  int32_t id;
};

class AddedVocab {
 public:
  // Normalized tokens are matched in normalized text, so their content goes
  // through the normalizer first, as HF does when it builds its automaton.
  AddedVocab(const nlohmann::json& added_tokens, const Normalizer* normalizer, const std::string& where);

  // Splits text with the tokens that are (normalized = true) or are not normalized.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;
  bool has_normalized() const { return !normalized_.empty(); }

  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> id_of(std::string_view content) const;
  bool is_special_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  int32_t max_id() const { return max_id_; }

 private:
  // A byte trie over one set of token contents.
  struct Trie {
    std::array<int32_t, 256> root{};              // first byte → node, -1 when no token starts so
    std::vector<int32_t> terminal;                // node → index into tokens_, -1
    std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) → node
    bool empty() const { return terminal.empty(); }
    void add(std::string_view content, int32_t token_index);
    // The longest token starting at text[i]: its end, and its index in tokens_.
    bool longest_at(std::string_view text, size_t i, size_t& end, int32_t& token_index) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_set<std::string> special_contents_;
  Trie plain_, normalized_;
  int32_t max_id_ = -1;
};

}  // namespace kettle::tok
