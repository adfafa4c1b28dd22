// TokenVocabulary: what a grammar sees of a tokenizer — each id's bytes (as the
// decoder would produce them mid-text) laid out as a trie in depth-first order, and
// the ids that end a generation. allowed() walks the trie from an automaton state,
// stepping one byte per trie node and skipping a whole subtree where the grammar
// dies, so tokens sharing a prefix share its work.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/automaton.h"

namespace kettle {
class Tokenizer;
}

namespace kettle::grammar {

class TokenVocabulary {
 public:
  // bytes[id]: the token's bytes; empty: never allowed by a grammar (special tokens).
  TokenVocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids);
  // Every id of `tokenizer`: special added tokens are left out (empty), except that
  // `end_ids` (the model's end-of-sequence ids) end a sentence.
  static TokenVocabulary from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> end_ids);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  bool is_end(int32_t id) const;

  // Sets the bit of every token allowed from `state` in words[0, words.size()) (cleared
  // first; ids past the vocabulary stay 0): tokens whose bytes the grammar can take, and
  // the end ids when the state accepts.
  void allowed(Automaton& automaton, int32_t state, std::span<uint32_t> words) const;

 private:
  struct Node {
    int32_t end;          // the index after this node's subtree
    int32_t first_token;  // into token_ids_: the ids whose bytes end here
    int32_t n_tokens;
    uint16_t depth;       // 1 for a first byte
    uint8_t byte;
  };

  std::vector<std::string> bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<Node> nodes_;  // depth-first order
  std::vector<int32_t> token_ids_;
  int max_depth_ = 0;
};

}  // namespace kettle::grammar
