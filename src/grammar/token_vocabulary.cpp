#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace kettle::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty() && !is_end(static_cast<int32_t>(id))) order.push_back(static_cast<int32_t>(id));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  // Sorted byte strings give the trie in depth-first order: each token adds the nodes
  // past its common prefix with the one before; a node's subtree ends when a later token
  // leaves its prefix.
  std::vector<int32_t> path;  // node indices from depth 1
  const std::string* previous = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (previous != nullptr)
      while (common < s.size() && common < previous->size() && s[common] == (*previous)[common]) ++common;
    common = std::min(common, path.size());
    while (path.size() > common) {
      nodes_[static_cast<size_t>(path.back())].end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back({0, 0, 0, static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)), static_cast<uint8_t>(s[d])});
    }
    Node& last = nodes_[static_cast<size_t>(path.back())];
    if (last.n_tokens == 0) last.first_token = static_cast<int32_t>(token_ids_.size());
    token_ids_.push_back(id);  // equal strings are adjacent in the order, so their ids are too
    ++last.n_tokens;
    max_depth_ = std::max<int>(max_depth_, static_cast<int>(s.size()));
    previous = &s;
  }
  for (int32_t i : path) nodes_[static_cast<size_t>(i)].end = static_cast<int32_t>(nodes_.size());
}

TokenVocabulary TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> end_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (size_t id = 0; id < bytes.size(); ++id) bytes[id] = tokenizer.token_bytes(static_cast<int32_t>(id));
  return TokenVocabulary(std::move(bytes), std::move(end_ids));
}

bool TokenVocabulary::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void TokenVocabulary::allowed(Automaton& automaton, int32_t state, std::span<uint32_t> words) const {
  std::fill(words.begin(), words.end(), 0u);
  auto set = [&](int32_t id) {
    const auto i = static_cast<size_t>(id);
    if (i / 32 < words.size()) words[i / 32] |= 1u << (i % 32);
  };
  if (automaton.accepting(state))
    for (int32_t id : end_ids_) set(id);
  if (!automaton.can_continue(state)) return;
  std::vector<int32_t> at(static_cast<size_t>(max_depth_) + 1);
  at[0] = state;
  const auto n = static_cast<int32_t>(nodes_.size());
  for (int32_t i = 0; i < n;) {
    const Node& node = nodes_[static_cast<size_t>(i)];
    const int32_t next = automaton.step(at[node.depth - 1u], node.byte);
    if (next == Automaton::kDead) {
      i = node.end;
      continue;
    }
    at[node.depth] = next;
    for (int32_t k = 0; k < node.n_tokens; ++k) set(token_ids_[static_cast<size_t>(node.first_token + k)]);
    ++i;
  }
}

}  // namespace kettle::grammar
