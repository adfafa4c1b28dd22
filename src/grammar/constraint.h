// Constraint: a compiled grammar over one vocabulary, shared by every sequence that
// asks for the same grammar; ConstraintMatcher: one sequence's place in it.
//
// Per step a matcher gives the token mask (which ids may come next) for its state.
// Masks are cached per automaton state, so a state met again — the inside of a
// string, the same spot of the same schema in another request — costs a copy. The
// automaton's tables are bounded: past kMaxStates they are dropped and rebuilt as
// needed (matchers keep their state by value, so nothing is lost).
//
// Thread-safe: matchers of one constraint take its lock; different constraints run
// in parallel.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/token_vocabulary.h"

namespace kettle::grammar {

class Constraint {
 public:
  Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary, std::string description);

  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // What it was compiled from, for errors ("json_schema", "regex", …).
  const std::string& description() const { return description_; }

  static constexpr size_t kMaxStates = 16384;
  static constexpr size_t kMaxMasks = 256;

 private:
  friend class ConstraintMatcher;

  std::mutex mutex_;
  Automaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::string description_;
  std::unordered_map<int32_t, std::vector<uint32_t>> masks_;  // by state, this epoch
  uint64_t masks_epoch_ = 0;
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
  int32_t state();  // under the lock: the current state's id in this epoch

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
