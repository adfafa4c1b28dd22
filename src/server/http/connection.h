// One client connection of the EventServer, and the Waker that lets a
// handler's thread tell the event loop that a connection has bytes to send.
// Fields under "loop thread" are touched only by the event loop; the outbox
// and its flags are shared with the thread writing the response.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/http/request_parser.h"

namespace kettle::server::http {

using Clock = std::chrono::steady_clock;

struct Connection {
  enum class Phase {
    kReading,   // waiting for (the rest of) a request
    kHandling,  // a request is with the routes; its response is being written
    kRefusing,  // an error response for a request that could not be read, then the close
    kLingering  // after that response: reading and dropping what the client still sends
  };

  Connection(uint64_t id_, int fd_, std::string peer_, bool loopback_, const ParseLimits& limits)
      : id(id_), fd(fd_), peer(std::move(peer_)), loopback(loopback_), parser(std::in_place, limits) {}

  const uint64_t id;
  const int fd;
  const std::string peer;
  const bool loopback;

  // loop thread
  std::string in;  // bytes read and not yet parsed (a pipelined next request)
  std::optional<RequestParser> parser;
  Phase phase = Phase::kReading;
  Clock::time_point request_start = Clock::now();  // first byte of the request being read
  Clock::time_point last_activity = Clock::now();
  Clock::time_point phase_since = Clock::now();
  uint32_t events = 0;  // what epoll watches now
  bool keep_alive = true;
  bool continue_sent = false;
  int minor_version = 1;            // of the request being handled
  size_t response_bytes_sent = 0;   // of its response (the 100-continue probe goes only before any)

  // shared with the response's writer
  std::mutex mutex;
  std::condition_variable drained;  // the outbox shrank, or the connection closed
  std::string out;                  // bytes to send
  bool response_done = false;       // the whole response is in `out`
  bool close_after = false;         // the response said "Connection: close"
  bool closed = false;
  bool abort = false;               // the writer gave up: close without finishing
  Clock::time_point progress = Clock::now();  // last time bytes left the outbox
};

// Wakes the event loop for one connection (from any thread). It owns the loop's eventfd,
// and is shared with every exchange, so a handler may still wake it after the loop ended.
class Waker {
 public:
  Waker();  // throws kettle::Error when no eventfd can be had
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  int fd() const { return fd_; }
  void wake(uint64_t connection_id);
  std::vector<uint64_t> take();  // the woken ids, emptied

 private:
  int fd_;
  std::mutex mutex_;
  std::vector<uint64_t> woken_;
};

}  // namespace kettle::server::http
