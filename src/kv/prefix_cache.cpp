#include "kv/prefix_cache.h"

#include <algorithm>

namespace kettle {
namespace {

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace

PrefixCache::PrefixCache(size_t capacity_bytes, int64_t block_size)
    : capacity_(capacity_bytes), block_size_(std::max<int64_t>(1, block_size)) {}

size_t PrefixCache::bytes_of(const KvCache& kv) {
  return static_cast<size_t>(kv.capacity()) * KvCache::bytes_per_position(kv.n_layers(), kv.kv_size());
}

std::optional<PrefixCache::Lease> PrefixCache::take(const std::vector<int32_t>& prompt) {
  ++lookups_;
  const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;  // one prompt token always runs
  auto best = entries_.end();
  int64_t best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    int64_t n = std::min(common_prefix(it->tokens, prompt), limit);
    n -= n % block_size_;
    if (n > best_len) {
      best_len = n;
      best = it;
    }
  }
  if (best == entries_.end()) return std::nullopt;
  ++hits_;
  cached_tokens_ += best_len;
  bytes_ -= bytes_of(best->kv);
  Lease lease{std::move(best->kv), best_len};
  entries_.erase(best);
  lease.kv.set_length(best_len);
  return lease;
}

void PrefixCache::put(std::vector<int32_t> tokens, KvCache kv) {
  if (capacity_ == 0 || tokens.size() < static_cast<size_t>(block_size_)) return;
  if (bytes_of(kv) > capacity_) return;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->tokens.size() <= tokens.size() && std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin())) {
      bytes_ -= bytes_of(it->kv);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  bytes_ += bytes_of(kv);
  entries_.push_front({std::move(tokens), std::move(kv)});
  evict_to(capacity_);
}

void PrefixCache::evict_to(size_t capacity) {
  while (bytes_ > capacity && !entries_.empty()) {
    bytes_ -= bytes_of(entries_.back().kv);
    entries_.pop_back();
  }
}

int64_t PrefixCache::clear() {
  const auto n = static_cast<int64_t>(entries_.size());
  entries_.clear();
  bytes_ = 0;
  return n;
}

PrefixCacheStats PrefixCache::stats() const {
  return {lookups_, hits_, cached_tokens_, static_cast<int64_t>(entries_.size()), bytes_, capacity_};
}

}  // namespace kettle
