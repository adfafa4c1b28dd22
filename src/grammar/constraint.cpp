#include "grammar/constraint.h"

#include <algorithm>

#include "util/error.h"

namespace kettle::grammar {

Constraint::Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary, std::string description)
    : automaton_(std::move(grammar)), vocabulary_(std::move(vocabulary)), description_(std::move(description)) {
  masks_epoch_ = automaton_.epoch();
}

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<Constraint> constraint) : constraint_(std::move(constraint)) {
  std::lock_guard lock(constraint_->mutex_);
  Automaton& a = constraint_->automaton_;
  state_ = a.start();
  key_ = a.key(state_);
  epoch_ = a.epoch();
}

int32_t ConstraintMatcher::state() {
  Automaton& a = constraint_->automaton_;
  if (a.states() > Constraint::kMaxStates) a.reset();
  if (epoch_ != a.epoch()) {
    state_ = a.intern(key_);
    epoch_ = a.epoch();
  }
  return state_;
}

void ConstraintMatcher::fill_mask(std::span<uint32_t> words) {
  Constraint& c = *constraint_;
  std::lock_guard lock(c.mutex_);
  const int32_t s = state();
  if (c.masks_epoch_ != c.automaton_.epoch() || c.masks_.size() >= Constraint::kMaxMasks) {
    c.masks_.clear();
    c.masks_epoch_ = c.automaton_.epoch();
  }
  auto it = c.masks_.find(s);
  if (it == c.masks_.end() || it->second.size() != words.size()) {
    std::vector<uint32_t> mask(words.size());
    c.vocabulary_->allowed(c.automaton_, s, mask);
    // allowed() may have grown the tables past the budget: the next call resets them.
    it = c.masks_.insert_or_assign(s, std::move(mask)).first;
  }
  std::copy(it->second.begin(), it->second.end(), words.begin());
}

bool ConstraintMatcher::accept(int32_t token) {
  Constraint& c = *constraint_;
  const TokenVocabulary& v = *c.vocabulary_;
  std::lock_guard lock(c.mutex_);
  if (token < 0 || token >= v.size()) return false;
  if (v.is_end(token)) return key_.accepting;
  const std::string& bytes = v.bytes(token);
  if (bytes.empty()) return false;
  int32_t s = state();
  for (char b : bytes) {
    s = c.automaton_.step(s, static_cast<uint8_t>(b));
    if (s == Automaton::kDead) return false;
  }
  state_ = s;
  key_ = c.automaton_.key(s);
  return true;
}

ConstraintCache::ConstraintCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(std::max<size_t>(1, capacity)) {}

std::shared_ptr<Constraint> ConstraintCache::get(const std::string& gbnf, const std::string& root,
                                                 const std::string& description) {
  const std::string key = root + '\n' + gbnf;
  {
    std::lock_guard lock(mutex_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == key) {
        lru_.splice(lru_.begin(), lru_, it);
        return it->second;
      }
  }
  auto made = std::make_shared<Constraint>(parse_gbnf(gbnf, root), vocabulary_, description);  // outside the lock
  std::lock_guard lock(mutex_);
  lru_.emplace_front(key, made);
  if (lru_.size() > capacity_) lru_.pop_back();
  return made;
}

}  // namespace kettle::grammar
