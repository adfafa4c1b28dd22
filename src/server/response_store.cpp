#include "server/response_store.h"

namespace kettle::server {

bool ResponseStore::put(const std::string& id, Entry entry) {
  const size_t size = id.size() + entry.response.dump().size() + entry.conversation.dump().size();
  const std::lock_guard lock(mutex_);
  const Clock::time_point now = Clock::now();
  expire(now);
  if (auto it = by_id_.find(id); it != by_id_.end()) drop(it->second);
  if (size > max_bytes_) return false;
  while (bytes_ + size > max_bytes_ && !slots_.empty()) drop(slots_.begin());
  slots_.push_back(Slot{id, std::move(entry), size, now});
  by_id_[id] = std::prev(slots_.end());
  bytes_ += size;
  return true;
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  const std::lock_guard lock(mutex_);
  expire(Clock::now());
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second->entry;
}

bool ResponseStore::erase(const std::string& id) {
  const std::lock_guard lock(mutex_);
  expire(Clock::now());
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  drop(it->second);
  return true;
}

size_t ResponseStore::bytes() const {
  const std::lock_guard lock(mutex_);
  return bytes_;
}

void ResponseStore::expire(Clock::time_point now) {
  while (!slots_.empty() && now - slots_.front().stored >= ttl_) drop(slots_.begin());
}

void ResponseStore::drop(std::list<Slot>::iterator it) {
  bytes_ -= it->bytes;
  by_id_.erase(it->id);
  slots_.erase(it);
}

}  // namespace kettle::server
