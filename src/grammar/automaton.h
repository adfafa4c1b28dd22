// Automaton: a grammar run as a pushdown automaton over bytes, determinized
// lazily. A stack is a chain of grammar positions (the innermost first), interned
// so equal stacks are one id; a state is the set of stacks whose next element
// matches a byte, plus whether the input so far is a whole sentence. States and
// their byte transitions are interned and cached as they are first met, so the
// token-mask walk over the vocabulary mostly reads tables.
//
// A call to a rule in tail position does not push a return (its caller would only
// pop), so a repetition matches any length at a constant depth — a string inside a
// JSON value is one state, token after token.
//
// Thread-safe for walks: step(), intern() and the readers may run on many threads at
// once (a known transition is one atomic load; a new one is computed under a lock, once).
// reset() needs the caller to exclude every other call (Constraint's epoch lock).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace kettle::grammar {

// A state by value: its stacks (sorted ids) and whether it accepts. What a matcher
// keeps, so the automaton may drop its state tables (reset()) at any time.
struct StateKey {
  std::vector<int32_t> stacks;
  bool accepting = false;
  bool operator==(const StateKey&) const = default;
};

class Automaton {
 public:
  static constexpr int32_t kDead = -1;
  // Bounds on what one grammar may make the matcher hold (a grammar that passes them is
  // refused mid-generation with kettle::Error): parses alive at once, stack entries in all,
  // states between resets.
  static constexpr size_t kMaxStacks = 4096;
  static constexpr size_t kMaxNodes = size_t{1} << 22;
  static constexpr size_t kStateChunk = 1024, kStateChunks = 1024;

  explicit Automaton(Grammar grammar);

  int32_t start() const { return start_; }
  // The state after one more byte, or kDead.
  int32_t step(int32_t state, uint8_t byte) {
    const std::atomic<int32_t>* next = at(state).next.load(std::memory_order_acquire);
    if (next != nullptr) {
      const int32_t to = next[byte].load(std::memory_order_acquire);
      if (to != kUnknown) return to;
    }
    return step_slow(state, byte);
  }
  bool accepting(int32_t state) const { return at(state).key.accepting; }
  // True when some byte may follow (a state that accepts and cannot continue is complete).
  bool can_continue(int32_t state) const { return !at(state).key.stacks.empty(); }

  const StateKey& key(int32_t state) const { return at(state).key; }
  int32_t intern(const StateKey& key);

  size_t states() const { return n_states_.load(std::memory_order_acquire); }
  // Drops the state tables (stacks stay): ids handed out before are void. Done by the
  // owner, with every other caller excluded, when states() passes its budget.
  void reset();
  // Bumped by each reset(), so holders of state ids know to intern their keys again.
  uint64_t epoch() const { return epoch_; }

 private:
  struct Node {
    int32_t pos;     // the next element of the innermost rule
    int32_t parent;  // the stack below (0: none)
  };
  struct State {
    StateKey key;
    // [256] once a transition is asked for; kUnknown until computed. Written under grow_.
    std::atomic<std::atomic<int32_t>*> next{nullptr};
    ~State() { delete[] next.load(); }
  };
  static constexpr int32_t kUnknown = -2;

  // States live in chunks that never move, so readers index them while others add.
  const State& at(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return chunks_[i / kStateChunk][i % kStateChunk];
  }
  State& at(int32_t id) { return const_cast<State&>(static_cast<const Automaton*>(this)->at(id)); }
  int32_t step_slow(int32_t state, uint8_t byte);
  int32_t intern_locked(const StateKey& key);
  int32_t node(int32_t pos, int32_t parent);
  // Adds to `out` every stack reachable from `stack` whose top is a byte set, expanding
  // rule calls and returns (stack 0 reached: accepting).
  void expand(int32_t stack, std::vector<int32_t>& out, bool& accepting);
  void close(std::vector<int32_t>& stacks, bool& accepting, StateKey& key);

  Grammar g_;
  std::mutex grow_;  // what follows, and every new state or transition
  std::vector<Node> nodes_;  // [0]: the empty stack
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::array<std::unique_ptr<State[]>, kStateChunks> chunks_;
  std::atomic<size_t> n_states_{0};
  std::unordered_map<std::string, int32_t> state_ids_;
  int32_t start_ = -1;
  uint64_t epoch_ = 0;
  // Scratch of expand().
  std::vector<int32_t> work_, seen_list_;
  std::vector<uint8_t> seen_;
};

}  // namespace kettle::grammar
