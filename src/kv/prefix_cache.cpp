// The token-block tree: a path from the root spells a prefix block by block;
// nodes hold pool references; holds count along a path up to its root, and the
// unheld leaves are kept ordered by last use for eviction.
#include "kv/prefix_cache.h"

#include <algorithm>

namespace kettle {

PrefixCache::Hold::Hold(Hold&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)), node_(std::exchange(other.node_, nullptr)) {}

PrefixCache::Hold& PrefixCache::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    release();
    cache_ = std::exchange(other.cache_, nullptr);
    node_ = std::exchange(other.node_, nullptr);
  }
  return *this;
}

void PrefixCache::Hold::release() {
  if (node_ == nullptr) return;
  Node* node = std::exchange(node_, nullptr);
  cache_->unlock(node);
  cache_->trim();
}

PrefixCache::PrefixCache(KvPool& pool, size_t capacity_bytes) : pool_(pool), capacity_(capacity_bytes) {}

// Holds end before the cache (its owner's sequences end first); whatever is left goes.
PrefixCache::~PrefixCache() {
  for (auto& [scope, root] : roots_) drop_all(root);
}

void PrefixCache::drop_all(Node& node) {
  for (auto& [key, child] : node.children) drop_all(*child);
  if (node.parent)
    for (int kind = 0; kind < KvPool::kKinds; ++kind) pool_.release(kind, node.block[static_cast<size_t>(kind)]);
}

size_t PrefixCache::bytes_of(const Node& node) const {
  size_t bytes = 0;
  for (int kind = 0; kind < KvPool::kKinds; ++kind)
    if (node.block[static_cast<size_t>(kind)] > 0) bytes += pool_.bytes_per_block(kind);
  return bytes;
}

void PrefixCache::relist(Node& node) {
  const bool leaf = node.parent && node.children.empty() && node.holds == 0;
  if (leaf == node.listed) return;
  if (leaf)
    leaves_.insert({node.used, &node});
  else
    leaves_.erase({node.used, &node});
  node.listed = leaf;
}

void PrefixCache::touch(Node& node) {
  const bool listed = node.listed;
  if (listed) leaves_.erase({node.used, &node});
  node.used = ++clock_;
  if (listed) leaves_.insert({node.used, &node});
}

void PrefixCache::lock(Node* node) {
  for (; node && node->parent; node = node->parent)
    if (node->holds++ == 0) {
      held_bytes_ += bytes_of(*node);
      relist(*node);
    }
}

void PrefixCache::unlock(Node* node) {
  for (; node && node->parent; node = node->parent)
    if (--node->holds == 0) {
      held_bytes_ -= bytes_of(*node);
      relist(*node);
    }
}

// The new path is held before the old one is let go, so their common part never looks unheld.
void PrefixCache::hold_path(Hold& hold, Node* deepest) {
  if (hold.node_ == deepest) return;
  lock(deepest);
  if (hold.node_ != nullptr) unlock(hold.node_);
  hold.cache_ = this;
  hold.node_ = deepest;
}

void PrefixCache::trim() {
  while (bytes_ - held_bytes_ > capacity_ && evict_one()) {
  }
}

// A continuation at position P = blocks × block_size reads window layers' keys from
// P - window + 1: those blocks must still be held.
bool PrefixCache::usable_window(const std::vector<Node*>& path, size_t blocks) const {
  if (!pool_.has_kind(KvPool::kWindow)) return true;
  const int64_t bs = pool_.block_size();
  const int64_t p = static_cast<int64_t>(blocks) * bs;
  const auto first = static_cast<size_t>(std::max<int64_t>(0, p - pool_.window() + 1) / bs);
  for (size_t b = first; b < blocks; ++b)
    if (path[b]->block[KvPool::kWindow] == 0) return false;
  return true;
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> prompt, uint64_t scope) {
  ++lookups_;
  const auto bs = static_cast<size_t>(pool_.block_size());
  std::vector<Node*> path;
  auto root = roots_.find(scope);
  if (root == roots_.end()) return {};
  Node* node = &root->second;
  std::vector<int32_t> key(bs);
  // One prompt token always runs, so at most (size - 1) / bs whole blocks.
  while (prompt.size() > 0 && (path.size() + 1) * bs <= prompt.size() - 1) {
    std::copy_n(prompt.begin() + static_cast<std::ptrdiff_t>(path.size() * bs), bs, key.begin());
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    path.push_back(node);
  }
  size_t blocks = path.size();
  while (blocks > 0 && !usable_window(path, blocks)) --blocks;
  Match m;
  if (blocks == 0) return m;
  for (size_t b = 0; b < blocks; ++b) {
    touch(*path[b]);
    for (int kind = 0; kind < KvPool::kKinds; ++kind)
      if (pool_.has_kind(kind)) m.blocks[static_cast<size_t>(kind)].push_back(path[b]->block[static_cast<size_t>(kind)]);
  }
  m.tokens = static_cast<int64_t>(blocks * bs);
  hold_path(m.hold, path[blocks - 1]);
  ++hits_;
  cached_tokens_ += m.tokens;
  return m;
}

void PrefixCache::insert(std::span<const int32_t> tokens, const KvCache& kv, uint64_t scope) {
  Hold ended;
  insert(tokens, kv, scope, ended);
}

void PrefixCache::insert(std::span<const int32_t> tokens, const KvCache& kv, uint64_t scope, Hold& hold) {
  if (capacity_ == 0) return;
  const auto bs = static_cast<size_t>(pool_.block_size());
  const size_t blocks = std::min(tokens.size(), static_cast<size_t>(kv.length())) / bs;
  if (blocks == 0) return;
  Node* node = &roots_[scope];
  node->scope = scope;
  for (size_t b = 0; b < blocks; ++b) {
    std::vector<int32_t> key(tokens.begin() + static_cast<std::ptrdiff_t>(b * bs),
                             tokens.begin() + static_cast<std::ptrdiff_t>((b + 1) * bs));
    auto it = node->children.find(key);
    Node* child = nullptr;
    if (it == node->children.end()) {
      auto created = std::make_unique<Node>();
      created->parent = node;
      created->tokens = key;
      created->used = ++clock_;
      child = created.get();
      node->children.emplace(std::move(key), std::move(created));
      relist(*node);  // no longer a leaf
      relist(*child);
      ++nodes_;
    } else {
      child = it->second.get();
      touch(*child);
    }
    for (int kind = 0; kind < KvPool::kKinds; ++kind) {  // fill what the node lacks (a window block let go)
      const std::vector<int32_t>& table = kv.table(kind);
      int32_t& held = child->block[static_cast<size_t>(kind)];
      if (held != 0 || b >= table.size() || table[b] == 0) continue;
      held = table[b];
      pool_.retain(kind, held);
      bytes_ += pool_.bytes_per_block(kind);
      if (child->holds > 0) held_bytes_ += pool_.bytes_per_block(kind);
    }
    node = child;
  }
  hold_path(hold, node);
  trim();
}

void PrefixCache::drop(Node& node) {
  leaves_.erase({node.used, &node});
  node.listed = false;
  for (int kind = 0; kind < KvPool::kKinds; ++kind) pool_.release(kind, node.block[static_cast<size_t>(kind)]);
  bytes_ -= bytes_of(node);
  --nodes_;
  Node* parent = node.parent;
  const std::vector<int32_t> key = node.tokens;
  parent->children.erase(key);  // destroys node
  relist(*parent);
  if (!parent->parent && parent->children.empty()) roots_.erase(parent->scope);
}

bool PrefixCache::evict_one() {
  if (leaves_.empty()) return false;
  drop(*leaves_.begin()->second);
  return true;
}

int64_t PrefixCache::clear() {
  const int64_t before = nodes_;
  while (evict_one()) {
  }
  return before - nodes_;
}

PrefixCacheStats PrefixCache::stats() const {
  return {lookups_, hits_, cached_tokens_, nodes_, bytes_, held_bytes_, capacity_};
}

}  // namespace kettle
