// KvCache's block table upkeep: blocks are taken from the pool as positions
// are reserved and given back when the cache is cleared or a window slides past.
#include "kv/kv_cache.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace kettle {

KvCache::KvCache(KvCache&& other) noexcept
    : pool_(other.pool_),
      length_(std::exchange(other.length_, 0)),
      window_released_(std::exchange(other.window_released_, 0)),
      margin_(other.margin_),
      tables_(std::move(other.tables_)) {
  for (auto& t : other.tables_) t.clear();
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    length_ = std::exchange(other.length_, 0);
    window_released_ = std::exchange(other.window_released_, 0);
    margin_ = other.margin_;
    tables_ = std::move(other.tables_);
    for (auto& t : other.tables_) t.clear();
  }
  return *this;
}

void KvCache::clear() {
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    for (int32_t block : tables_[static_cast<size_t>(kind)]) pool_->release(kind, block);
    tables_[static_cast<size_t>(kind)].clear();
  }
  length_ = 0;
  window_released_ = 0;
}

void KvCache::reserve(int64_t tokens) {
  const int64_t bs = pool_->block_size();
  const int64_t blocks = (tokens + bs - 1) / bs;
  // A window layer's query at position p sees keys from p - window + 1: blocks wholly
  // before length() - window + 1 are never read again.
  const int64_t first_seen = std::max<int64_t>(0, length_ - pool_->window() + 1) / bs;
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    if (!pool_->has_kind(kind)) continue;
    std::vector<int32_t>& table = tables_[static_cast<size_t>(kind)];
    // Entries already there are held (or, below the window, let go for good): only new
    // ones need blocks, so a decode step touches at most one entry.
    const auto held = static_cast<int64_t>(table.size());
    const int64_t from = std::max(held, kind == KvPool::kWindow ? first_seen : int64_t{0});
    if (held < blocks) table.resize(static_cast<size_t>(blocks), 0);
    for (int64_t b = from; b < blocks; ++b) {
      try {
        table[static_cast<size_t>(b)] = pool_->allocate(kind);
      } catch (...) {  // the pool is full: keep what was taken, no entry left pointing at block 0
        table.resize(static_cast<size_t>(std::max(held, b)));
        throw;
      }
    }
  }
}

void KvCache::set_length(int64_t length) {
  length_ = length;
  if (!pool_->has_kind(KvPool::kWindow)) return;
  std::vector<int32_t>& table = tables_[KvPool::kWindow];
  const int64_t unseen = std::max<int64_t>(0, length - margin_ - pool_->window() + 1) / pool_->block_size();
  for (; window_released_ < std::min<int64_t>(unseen, static_cast<int64_t>(table.size())); ++window_released_) {
    pool_->release(KvPool::kWindow, table[static_cast<size_t>(window_released_)]);
    table[static_cast<size_t>(window_released_)] = 0;
  }
}

void KvCache::truncate(int64_t length) {
  if (length >= length_) return;
  const int64_t bs = pool_->block_size();
  const auto keep = static_cast<size_t>((length + bs - 1) / bs);
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    std::vector<int32_t>& table = tables_[static_cast<size_t>(kind)];
    for (size_t b = keep; b < table.size(); ++b) pool_->release(kind, table[b]);
    if (table.size() > keep) table.resize(keep);
  }
  length_ = length;
  if (pool_->has_kind(KvPool::kWindow)) {
    const int64_t needed = std::max<int64_t>(0, length - pool_->window() + 1) / bs;
    if (needed < window_released_)
      fail(ErrorCategory::kInternal, "KV cache rolled back past its window's released blocks (margin too small)");
  }
}

void KvCache::adopt(const std::array<std::vector<int32_t>, KvPool::kKinds>& blocks, int64_t tokens) {
  clear();
  for (int kind = 0; kind < KvPool::kKinds; ++kind) {
    tables_[static_cast<size_t>(kind)] = blocks[static_cast<size_t>(kind)];
    for (int32_t block : blocks[static_cast<size_t>(kind)]) pool_->retain(kind, block);
  }
  length_ = tokens;
}

}  // namespace kettle
