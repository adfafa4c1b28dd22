#include "grammar/automaton.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace kettle::grammar {

Automaton::Automaton(Grammar grammar) : g_(std::move(grammar)) {
  nodes_.push_back({-1, 0});
  reset();
}

void Automaton::reset() {
  states_.clear();
  state_ids_.clear();
  ++epoch_;
  // The start: every alternative of the root, with nothing to return to.
  std::vector<int32_t> stacks;
  bool accepting = false;
  for (int32_t alt : g_.rules[static_cast<size_t>(g_.root)]) {
    if (g_.elements[static_cast<size_t>(alt)].kind == Element::kEnd)
      expand(0, stacks, accepting);
    else
      expand(node(alt, 0), stacks, accepting);
  }
  StateKey key;
  close(stacks, accepting, key);
  start_ = intern(key);
}

int32_t Automaton::start() { return start_; }

int32_t Automaton::node(int32_t pos, int32_t parent) {
  const uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, added] = node_ids_.try_emplace(k, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

void Automaton::expand(int32_t stack, std::vector<int32_t>& out, bool& accepting) {
  work_.push_back(stack);
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    if (seen_.size() <= static_cast<size_t>(s)) seen_.resize(nodes_.size() + 1024, 0);
    if (seen_[static_cast<size_t>(s)]) continue;
    seen_[static_cast<size_t>(s)] = 1;
    seen_list_.push_back(s);
    if (s == 0) {
      accepting = true;
      continue;
    }
    const Node n = nodes_[static_cast<size_t>(s)];
    const Element e = g_.elements[static_cast<size_t>(n.pos)];
    if (e.kind == Element::kBytes) {
      out.push_back(s);
    } else if (e.kind == Element::kEnd) {
      work_.push_back(n.parent);
    } else {
      // Tail call: nothing to come back to when the call ends its alternative.
      const int32_t ret =
          g_.elements[static_cast<size_t>(n.pos) + 1].kind == Element::kEnd ? n.parent : node(n.pos + 1, n.parent);
      for (int32_t alt : g_.rules[static_cast<size_t>(e.value)])
        work_.push_back(g_.elements[static_cast<size_t>(alt)].kind == Element::kEnd ? ret : node(alt, ret));
    }
  }
}

// Sorts and dedups the stacks into `key`, and forgets what expand() saw.
void Automaton::close(std::vector<int32_t>& stacks, bool& accepting, StateKey& key) {
  for (int32_t s : seen_list_) seen_[static_cast<size_t>(s)] = 0;
  seen_list_.clear();
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMaxStacks || nodes_.size() > kMaxNodes)
    fail(ErrorCategory::kInvalidArgument, "the grammar is too ambiguous to follow: {} parses at once (at most {}), {} "
         "stack entries (at most {})", stacks.size(), kMaxStacks, nodes_.size(), kMaxNodes);
  key.stacks = std::move(stacks);
  key.accepting = accepting;
}

int32_t Automaton::intern(const StateKey& key) {
  std::string bytes(key.stacks.size() * sizeof(int32_t) + 1, '\0');
  if (!key.stacks.empty()) std::memcpy(bytes.data(), key.stacks.data(), key.stacks.size() * sizeof(int32_t));
  bytes.back() = key.accepting ? 1 : 0;
  auto [it, added] = state_ids_.try_emplace(std::move(bytes), static_cast<int32_t>(states_.size()));
  if (added) states_.push_back({key, nullptr});
  return it->second;
}

int32_t Automaton::step(int32_t state, uint8_t byte) {
  {
    State& s = states_[static_cast<size_t>(state)];
    if (!s.next) {
      s.next = std::make_unique<int32_t[]>(256);
      std::fill(s.next.get(), s.next.get() + 256, kUnknown);
    }
    if (s.next[byte] != kUnknown) return s.next[byte];
  }
  std::vector<int32_t> stacks;
  bool accepting = false;
  // A copy: expand() may grow nodes_, and interning may grow states_.
  const std::vector<int32_t> from = states_[static_cast<size_t>(state)].key.stacks;
  for (int32_t s : from) {
    const Node n = nodes_[static_cast<size_t>(s)];
    const Element e = g_.elements[static_cast<size_t>(n.pos)];
    if (!g_.byte_sets[static_cast<size_t>(e.value)].has(byte)) continue;
    const Element after = g_.elements[static_cast<size_t>(n.pos) + 1];
    expand(after.kind == Element::kEnd ? n.parent : node(n.pos + 1, n.parent), stacks, accepting);
  }
  StateKey key;
  close(stacks, accepting, key);
  const int32_t to = key.stacks.empty() && !key.accepting ? kDead : intern(key);
  states_[static_cast<size_t>(state)].next[byte] = to;
  return to;
}

}  // namespace kettle::grammar
