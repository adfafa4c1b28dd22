// ConnectionWatch: tells whether the client of a request has gone away while
// its non-streaming response is still being generated. cpp-httplib (Debian's
// 0.11) neither exposes the socket nor reports a closed peer before a write,
// so the watch finds the connection's socket among this process's descriptors
// by its two endpoints (local and remote address and port, which identify one
// TCP connection) and polls it for a hang-up without reading from it.
#pragma once

#include <string>

namespace kettle::server {

class ConnectionWatch {
 public:
  ConnectionWatch(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

  // True once the peer has closed (or reset) the connection.
  bool peer_closed() const;

 private:
  int fd_ = -1;  // -1: not found (never reports closed)
};

}  // namespace kettle::server
