// The Responses API's memory: each stored response (by id) with the
// conversation it ends (messages as chat templates take them, its own output
// included), so a later request's previous_response_id continues it. Bounded
// in bytes (the oldest go first) and in time (entries expire after the TTL);
// shared by the request threads under a mutex.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace kettle::server {

class ResponseStore {
 public:
  struct Entry {
    nlohmann::ordered_json response;      // the Response object GET returns
    nlohmann::ordered_json conversation;  // messages up to and including this response's output
  };

  ResponseStore(size_t max_bytes, std::chrono::seconds ttl) : max_bytes_(max_bytes), ttl_(ttl) {}

  // False (nothing stored) when the entry alone is larger than the cap.
  bool put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  size_t bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    std::string id;
    Entry entry;
    size_t bytes = 0;
    Clock::time_point stored;
  };
  void expire(Clock::time_point now);  // under mutex_
  void drop(std::list<Slot>::iterator it);

  size_t max_bytes_;
  std::chrono::seconds ttl_;
  mutable std::mutex mutex_;
  std::list<Slot> slots_;  // oldest first
  std::unordered_map<std::string, std::list<Slot>::iterator> by_id_;
  size_t bytes_ = 0;
};

}  // namespace kettle::server
