// Upstream: one HTTP/1.1 exchange with a server on a unix socket, as the
// supervising parent of `serve --isolate` relays a client's request to its
// engine child (or over TCP, as `kettle bench serve` loads a server): the request written whole (Connection: close), the response's
// head read, then its body piece by piece as it arrives — Content-Length,
// chunked, or until the connection closes. Every wait polls, so a caller can
// give up (its client left) within 100 ms; heads are bounded (64 KB).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/http/message.h"

namespace kettle::server::http {

class Upstream {
 public:
  using Cancelled = std::function<bool()>;

  // Connects to the unix socket at path; nullptr (and why) when nothing accepts there.
  static std::unique_ptr<Upstream> connect(const std::string& path, std::string& why);
  // Connects to host:port over TCP (`kettle bench serve`'s client); nullptr and why on failure.
  static std::unique_ptr<Upstream> connect_tcp(const std::string& host, int port, std::string& why);
  ~Upstream();
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

  // The request as it goes upstream: hop-by-hop headers dropped, Content-Length set,
  // Connection: close, and the client it came from (forwarded_peer in event_server.h).
  static std::string serialize(const Request& request);

  bool send(const std::string& bytes);
  // The response's status and headers (names lower-case); false when the connection ended,
  // failed or timed out first, or cancelled() said so. head_request: the answer to a HEAD,
  // which has no body whatever its headers say.
  bool read_head(Response& head, double timeout_seconds, const Cancelled& cancelled, bool head_request);
  // The next piece of the body into `piece` (done: the body is complete, piece may be
  // empty); false when the connection ended before the body did, or cancelled() said so.
  bool read_body(std::string& piece, bool& done, const Cancelled& cancelled);
  // Whether the head named a body of known length (else it is chunked or runs to the close).
  bool sized() const { return mode_ == Body::kLength; }

 private:
  enum class Body { kLength, kChunked, kUntilClose, kNone };
  explicit Upstream(int fd) : fd_(fd) {}
  // More bytes into buffer_; false at the end of the stream, on an error or when cancelled.
  bool fill(double timeout_seconds, const Cancelled& cancelled);
  bool read_chunked(std::string& piece, bool& done, const Cancelled& cancelled);

  int fd_;
  std::string buffer_;  // received, not yet consumed
  Body mode_ = Body::kUntilClose;
  size_t remaining_ = 0;  // kLength: bytes of the body still to come
  bool eof_ = false;
};

}  // namespace kettle::server::http
