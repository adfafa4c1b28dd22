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
// Not thread-safe: one caller at a time (Constraint holds the lock).
#pragma once

#include <cstdint>
#include <memory>
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
  // refused mid-generation with kettle::Error): parses alive at once, stack entries in all.
  static constexpr size_t kMaxStacks = 4096;
  static constexpr size_t kMaxNodes = size_t{1} << 22;

  explicit Automaton(Grammar grammar);

  int32_t start();
  // The state after one more byte, or kDead.
  int32_t step(int32_t state, uint8_t byte);
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].key.accepting; }
  // True when some byte may follow (a state that accepts and cannot continue is complete).
  bool can_continue(int32_t state) const { return !states_[static_cast<size_t>(state)].key.stacks.empty(); }

  const StateKey& key(int32_t state) const { return states_[static_cast<size_t>(state)].key; }
  int32_t intern(const StateKey& key);

  size_t states() const { return states_.size(); }
  // Drops the state tables (stacks stay): ids handed out before are void. Done by the
  // owner when states() passes its budget.
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
    std::unique_ptr<int32_t[]> next;  // [256] once a transition is asked for; kUnknown until computed
  };
  static constexpr int32_t kUnknown = -2;

  int32_t node(int32_t pos, int32_t parent);
  // Adds to `out` every stack reachable from `stack` whose top is a byte set, expanding
  // rule calls and returns (stack 0 reached: accepting).
  void expand(int32_t stack, std::vector<int32_t>& out, bool& accepting);
  void close(std::vector<int32_t>& stacks, bool& accepting, StateKey& key);

  Grammar g_;
  std::vector<Node> nodes_;  // [0]: the empty stack
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  int32_t start_ = -1;
  uint64_t epoch_ = 0;
  // Scratch of expand().
  std::vector<int32_t> work_, seen_list_;
  std::vector<uint8_t> seen_;
};

}  // namespace kettle::grammar
