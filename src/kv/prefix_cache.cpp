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
  node.used_at = std::chrono::steady_clock::now();
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
  Node* node = &root(scope);
  for (size_t b = 0; b < blocks; ++b) {
    std::vector<int32_t> key(tokens.begin() + static_cast<std::ptrdiff_t>(b * bs),
                             tokens.begin() + static_cast<std::ptrdiff_t>((b + 1) * bs));
    auto it = node->children.find(key);
    Node* child = it == node->children.end() ? add_child(*node, std::move(key)) : it->second.get();
    touch(*child);
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

PrefixCache::Node& PrefixCache::root(uint64_t scope) {
  auto [it, added] = roots_.try_emplace(scope);
  if (added) {
    it->second.scope = scope;
    it->second.digest = prefix_root_digest(scope);
  }
  return it->second;
}

// A new leaf below `parent`, holding no blocks yet.
PrefixCache::Node* PrefixCache::add_child(Node& parent, std::vector<int32_t> key) {
  auto created = std::make_unique<Node>();
  created->parent = &parent;
  created->tokens = key;
  created->digest = prefix_block_digest(parent.digest, key);
  created->used = ++clock_;
  created->used_at = std::chrono::steady_clock::now();
  Node* child = created.get();
  parent.children.emplace(std::move(key), std::move(created));
  relist(parent);  // no longer a leaf
  relist(*child);
  ++nodes_;
  return child;
}

bool PrefixCache::hand_to_disk(Node& node) {
  if (tier_->contains(node.digest)) return true;
  SsdBlock block;
  const Node* root = node.parent;
  for (; root->parent; root = root->parent) ++block.depth;
  block.scope = root->scope;
  block.parent = node.parent->digest;
  block.digest = node.digest;
  block.tokens = node.tokens;
  for (int kind = 0; kind < KvPool::kKinds; ++kind)
    if (const int32_t id = node.block[static_cast<size_t>(kind)]; id > 0)
      block.kinds[static_cast<size_t>(kind)] = pool_.read_block(kind, id);
  node.handed_to_disk = tier_->save(std::move(block));
  return node.handed_to_disk;
}

void PrefixCache::drop(Node& node) {
  if (tier_ && !node.handed_to_disk) hand_to_disk(node);
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

template <typename Visit>
void PrefixCache::visit_breadth_first(Visit visit) const {
  std::vector<Node*> level;
  for (const auto& [scope, r] : roots_)
    for (const auto& [key, child] : r.children) level.push_back(child.get());
  while (!level.empty()) {
    std::vector<Node*> next;
    for (Node* node : level) {
      if (!visit(*node)) return;
      for (const auto& [key, child] : node->children) next.push_back(child.get());
    }
    level.swap(next);
  }
}

std::vector<Sha256Digest> PrefixCache::digests(std::span<const int32_t> prompt, uint64_t scope) const {
  const auto bs = static_cast<size_t>(pool_.block_size());
  const size_t blocks = prompt.empty() ? 0 : (prompt.size() - 1) / bs;
  std::vector<Sha256Digest> out;
  out.reserve(blocks);
  Sha256Digest digest = prefix_root_digest(scope);
  for (size_t b = 0; b < blocks; ++b) {
    digest = prefix_block_digest(digest, prompt.subspan(b * bs, bs));
    out.push_back(digest);
  }
  return out;
}

size_t PrefixCache::blocks_in_memory(std::span<const int32_t> prompt, uint64_t scope) const {
  const auto bs = static_cast<size_t>(pool_.block_size());
  auto r = roots_.find(scope);
  if (r == roots_.end()) return 0;
  const Node* node = &r->second;
  size_t blocks = 0;
  std::vector<int32_t> key(bs);
  while ((blocks + 1) * bs < prompt.size()) {
    std::copy_n(prompt.begin() + static_cast<std::ptrdiff_t>(blocks * bs), bs, key.begin());
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    ++blocks;
  }
  return blocks;
}

void PrefixCache::restore(std::span<const int32_t> prompt, uint64_t scope, size_t first,
                          const std::vector<SsdEntry>& entries) {
  if (capacity_ == 0 || entries.empty()) return;
  const auto bs = static_cast<size_t>(pool_.block_size());
  Node* node = &root(scope);
  Hold hold;  // keeps the path from being evicted while its next blocks are allocated
  for (int kind = 0; kind < KvPool::kKinds; ++kind)  // one growth for them all, not a doubling at a time
    if (pool_.has_kind(kind)) pool_.reserve(kind, static_cast<int64_t>(entries.size()));
  for (size_t b = 0; b < first + entries.size() && (b + 1) * bs < prompt.size(); ++b) {
    std::vector<int32_t> key(prompt.begin() + static_cast<std::ptrdiff_t>(b * bs),
                             prompt.begin() + static_cast<std::ptrdiff_t>((b + 1) * bs));
    auto it = node->children.find(key);
    Node* child = nullptr;
    if (it != node->children.end()) {
      child = it->second.get();
    } else {
      if (b < first) break;  // the path to the restored blocks was evicted meanwhile
      const SsdEntry& entry = entries[b - first];
      if (entry.header.tokens != key) break;
      std::array<int32_t, KvPool::kKinds> ids{};
      try {
        for (size_t t = 0; t < entry.header.tensors.size(); ++t) {
          const int kind = entry.header.tensors[t].kind;
          if (kind < 0 || kind >= KvPool::kKinds || !pool_.has_kind(kind) || ids[static_cast<size_t>(kind)] != 0) continue;
          const int32_t id = pool_.allocate(kind);
          ids[static_cast<size_t>(kind)] = id;
          pool_.write_block(kind, id, entry.tensor(t));
        }
      } catch (const std::exception&) {  // the pool is full of held blocks: restore what fitted
        for (int kind = 0; kind < KvPool::kKinds; ++kind) pool_.release(kind, ids[static_cast<size_t>(kind)]);
        break;
      }
      child = add_child(*node, std::move(key));
      child->block = ids;
      child->handed_to_disk = true;
      bytes_ += bytes_of(*child);
    }
    touch(*child);
    hold_path(hold, child);
    node = child;
  }
  hold.release();  // trims past the cap
}

int64_t PrefixCache::write_behind(bool again) {
  if (tier_ == nullptr) return 0;
  int64_t taken = 0;
  visit_breadth_first([&](Node& node) {
    if ((node.handed_to_disk && !again) || tier_->contains(node.digest)) return true;
    if (!hand_to_disk(node)) return false;
    ++taken;
    return true;
  });
  return taken;
}

void PrefixCache::write_path(const Hold& hold) {
  if (tier_ == nullptr) return;
  for (Node* node = hold.node_; node && node->parent; node = node->parent)
    if (!node->handed_to_disk) hand_to_disk(*node);  // (it skips what is on disk)
}

int64_t PrefixCache::not_on_disk() const {
  if (tier_ == nullptr) return nodes_;
  int64_t n = 0;
  visit_breadth_first([&](const Node& node) {
    if (!tier_->contains(node.digest)) ++n;
    return true;
  });
  return n;
}

int64_t PrefixCache::demote_idle(double seconds) {
  const auto cutoff = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                             std::chrono::duration<double>(seconds));
  int64_t n = 0;
  while (!leaves_.empty() && leaves_.begin()->second->used_at <= cutoff) {
    drop(*leaves_.begin()->second);
    ++n;
  }
  return n;
}

PrefixCacheStats PrefixCache::stats() const {
  return {lookups_, hits_, cached_tokens_, nodes_, bytes_, held_bytes_, capacity_};
}

}  // namespace kettle
