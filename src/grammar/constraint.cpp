#include "grammar/constraint.h"

#include <algorithm>

#include "util/error.h"

namespace kettle::grammar {

Constraint::Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary, std::string description,
                       size_t max_states)
    : automaton_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      description_(std::move(description)),
      max_states_(max_states) {
  const size_t mask_bytes = static_cast<size_t>((vocabulary_->size() + 31) / 32) * sizeof(uint32_t);
  max_masks_ = std::max<size_t>(256, kMaskCacheBytes / std::max<size_t>(1, mask_bytes));
}

std::shared_lock<std::shared_mutex> Constraint::enter() {
  if (automaton_.states() > max_states_) {
    std::unique_lock exclusive(epoch_mutex_);
    if (automaton_.states() > max_states_) {
      automaton_.reset();
      std::lock_guard lock(masks_mutex_);
      masks_.clear();
      mask_index_.clear();
    }
  }
  return std::shared_lock(epoch_mutex_);
}

Constraint::Mask Constraint::cached_mask(int32_t state) {
  std::lock_guard lock(masks_mutex_);
  const auto it = mask_index_.find(state);
  if (it == mask_index_.end()) return nullptr;
  masks_.splice(masks_.begin(), masks_, it->second);
  return it->second->second;
}

void Constraint::keep_mask(int32_t state, Mask mask) {
  std::lock_guard lock(masks_mutex_);
  if (mask_index_.count(state)) return;  // another walk made it meanwhile
  masks_.emplace_front(state, std::move(mask));
  mask_index_[state] = masks_.begin();
  if (masks_.size() > max_masks_) {
    mask_index_.erase(masks_.back().first);
    masks_.pop_back();
  }
}

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<Constraint> constraint) : constraint_(std::move(constraint)) {
  const auto epoch = constraint_->enter();
  Automaton& a = constraint_->automaton_;
  state_ = a.start();
  key_ = a.key(state_);
  epoch_ = a.epoch();
}

int32_t ConstraintMatcher::state() {
  Automaton& a = constraint_->automaton_;
  if (epoch_ != a.epoch()) {
    state_ = a.intern(key_);
    epoch_ = a.epoch();
  }
  return state_;
}

void ConstraintMatcher::fill_mask(std::span<uint32_t> words) {
  Constraint& c = *constraint_;
  const auto epoch = c.enter();
  const int32_t s = state();
  Constraint::Mask mask = c.cached_mask(s);
  if (!mask || mask->size() != words.size()) {
    auto made = std::make_shared<std::vector<uint32_t>>(words.size());
    c.vocabulary_->allowed(c.automaton_, s, *made);  // in parallel with other rows' walks
    mask = made;
    c.keep_mask(s, mask);
  }
  std::copy(mask->begin(), mask->end(), words.begin());
}

bool ConstraintMatcher::accept(int32_t token) {
  Constraint& c = *constraint_;
  const TokenVocabulary& v = *c.vocabulary_;
  if (token < 0 || token >= v.size()) return false;
  if (v.is_end(token)) return key_.accepting;
  const std::string& bytes = v.bytes(token);
  if (bytes.empty()) return false;
  const auto epoch = c.enter();
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
