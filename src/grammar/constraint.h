// Constraint: a compiled grammar over one vocabulary, shared by every sequence that
// asks for the same grammar; ConstraintMatcher: one sequence's place in it.
//
// Per step a matcher gives the token mask (which ids may come next) for its state.
// Masks are cached per automaton state (least recently used dropped past a byte
// budget), so a state met again — the inside of a string, the same spot of the same
// schema in another request — costs a copy. The automaton's tables are bounded: past
// kMaxStates they are dropped and rebuilt as needed (matchers keep their state by
// value, so nothing is lost).
//
// Thread-safe, and parallel: matchers of one constraint (the rows of one schema in a
// batch) fill their masks at once on the engine's mask threads — walks share the
// automaton's tables and the mask cache; only a reset of the tables excludes them.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/token_vocabulary.h"

namespace kettle::grammar {

class Constraint {
 public:
  // max_states: the automaton's tables are dropped past it (tests make it small).
  Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary, std::string description,
             size_t max_states = kMaxStates);

  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // What it was compiled from, for errors ("json_schema", "regex", …).
  const std::string& description() const { return description_; }

  static constexpr size_t kMaxStates = 16384;
  static constexpr size_t kMaskCacheBytes = size_t{32} << 20;  // at least 256 masks whatever the vocabulary

 private:
  friend class ConstraintMatcher;
  using Mask = std::shared_ptr<const std::vector<uint32_t>>;

  // Drops the automaton's tables (and the masks keyed by their states) once past
  // kMaxStates; then holds the epoch shared for the caller's walk.
  std::shared_lock<std::shared_mutex> enter();
  Mask cached_mask(int32_t state);
  void keep_mask(int32_t state, Mask mask);

  std::shared_mutex epoch_mutex_;  // shared: walks; exclusive: a reset
  Automaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::string description_;
  size_t max_states_;
  size_t max_masks_;
  std::mutex masks_mutex_;
  std::list<std::pair<int32_t, Mask>> masks_;  // by state (this epoch), most recent first
  std::unordered_map<int32_t, std::list<std::pair<int32_t, Mask>>::iterator> mask_index_;
};

class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<Constraint> constraint);

  // words: ceil(vocab / 32) bits, bit id set when token id may come next.
  void fill_mask(std::span<uint32_t> words);
  // Takes a token: false when the grammar does not allow it (the state is kept).
  bool accept(int32_t token);
  // The text so far is a whole sentence / is one and nothing may follow it.
  bool accepting() const { return key_.accepting; }
  bool complete() const { return key_.accepting && key_.stacks.empty(); }
  const Constraint& constraint() const { return *constraint_; }

 private:
  int32_t state();  // inside enter(): the current state's id in this epoch

  std::shared_ptr<Constraint> constraint_;
  StateKey key_;
  int32_t state_ = 0;
  uint64_t epoch_ = 0;
};

// Compiled constraints by their GBNF text, the least recently used dropped past
// `capacity`: requests with the same schema share one (and its warm mask cache).
class ConstraintCache {
 public:
  ConstraintCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity = 16);
  // The grammar of `gbnf` starting at rule `root`. Throws kettle::Error (kInvalidArgument)
  // when the text does not compile.
  std::shared_ptr<Constraint> get(const std::string& gbnf, const std::string& root, const std::string& description);
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t capacity_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<Constraint>>> lru_;  // most recent first
};

}  // namespace kettle::grammar
