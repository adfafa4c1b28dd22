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
  std::lock_guard lock(grow_);
  for (auto& chunk : chunks_) chunk.reset();
  n_states_.store(0, std::memory_order_release);
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
  start_ = intern_locked(key);
}

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
  std::lock_guard lock(grow_);
  return intern_locked(key);
}

int32_t Automaton::intern_locked(const StateKey& key) {
  std::string bytes(key.stacks.size() * sizeof(int32_t) + 1, '\0');
  if (!key.stacks.empty()) std::memcpy(bytes.data(), key.stacks.data(), key.stacks.size() * sizeof(int32_t));
  bytes.back() = key.accepting ? 1 : 0;
  const size_t id = n_states_.load(std::memory_order_relaxed);
  auto [it, added] = state_ids_.try_emplace(std::move(bytes), static_cast<int32_t>(id));
  if (!added) return it->second;
  if (id >= kStateChunk * kStateChunks) {
    state_ids_.erase(it);
    fail(ErrorCategory::kInvalidArgument, "the grammar is too large to follow: over {} automaton states",
         kStateChunk * kStateChunks);
  }
  auto& chunk = chunks_[id / kStateChunk];
  if (!chunk) chunk = std::make_unique<State[]>(kStateChunk);
  chunk[id % kStateChunk].key = key;
  n_states_.store(id + 1, std::memory_order_release);
  return it->second;
}

int32_t Automaton::step_slow(int32_t state, uint8_t byte) {
  std::lock_guard lock(grow_);
  State& s = at(state);
  std::atomic<int32_t>* next = s.next.load(std::memory_order_relaxed);
  if (next == nullptr) {
    next = new std::atomic<int32_t>[256];
    for (int b = 0; b < 256; ++b) next[b].store(kUnknown, std::memory_order_relaxed);
    s.next.store(next, std::memory_order_release);
  }
  if (const int32_t known = next[byte].load(std::memory_order_relaxed); known != kUnknown) return known;
  std::vector<int32_t> stacks;
  bool accepting = false;
  for (int32_t from : s.key.stacks) {  // the key does not move: states live in fixed chunks
    const Node n = nodes_[static_cast<size_t>(from)];
    const Element e = g_.elements[static_cast<size_t>(n.pos)];
    if (!g_.byte_sets[static_cast<size_t>(e.value)].has(byte)) continue;
    const Element after = g_.elements[static_cast<size_t>(n.pos) + 1];
    expand(after.kind == Element::kEnd ? n.parent : node(n.pos + 1, n.parent), stacks, accepting);
  }
  StateKey key;
  close(stacks, accepting, key);
  const int32_t to = key.stacks.empty() && !key.accepting ? kDead : intern_locked(key);
  next[byte].store(to, std::memory_order_release);
  return to;
}

}  // namespace kettle::grammar
