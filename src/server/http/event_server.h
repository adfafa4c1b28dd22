// EventServer: HTTP/1.1 on one epoll loop. Every connection costs a bounded
// amount whatever the client does: its request must arrive within deadlines
// measured over the whole request (not per read), its head and body are
// capped (RequestParser), connections past --max-connections are answered 503
// and closed at once, and idle keep-alive connections are closed after a
// while (at once on drain). Complete requests go to the handler on the loop
// thread, which answers quick routes there and hands slow ones to threads of
// its own (Exchange). Socket work happens on the loop thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "server/http/connection.h"
#include "server/http/exchange.h"
#include "server/http/request_parser.h"

namespace kettle::server::http {

// The headers a supervising parent names its client by on a unix socket (forwarded_peer).
inline constexpr const char* kForwardedPeer = "x-kettle-peer";
inline constexpr const char* kForwardedLoopback = "x-kettle-peer-loopback";
void forwarded_peer(Request& request);

struct ServerLimits {
  ParseLimits parse;
  double idle_seconds = 10.0;     // a kept-alive connection with no request in progress
  double header_seconds = 10.0;   // from a request's first byte to the end of its head
  double request_seconds = 60.0;  // from a request's first byte to the end of its body
  double stall_seconds = 30.0;    // a response the client stops reading
  int max_connections = 4096;
  int backlog = 4096;
};

struct ServerCounters {
  int64_t open = 0;     // connections open now
  int64_t accepted = 0;
  int64_t refused = 0;  // past max_connections (or file descriptors), or while draining
  int64_t timed_out = 0;
};

class EventServer {
 public:
  using Handler = std::function<void(std::shared_ptr<Exchange>)>;
  // The body of an error response the server writes itself (a request it could not read).
  using ErrorBody = std::function<std::string(int status, const std::string& message)>;

  EventServer(ServerLimits limits, Handler handler, ErrorBody error_body);
  ~EventServer();

  // Listens on host:port (port 0: any free one); throws kettle::Error naming them.
  void bind(const std::string& host, int port);
  // Listens on a unix socket at path instead (a stale socket file there is replaced; one a
  // server still answers on, or any other file, is an error); the file goes when the server does.
  // Its peers count as loopback clients: the file's permissions say who may connect.
  void bind_unix(const std::string& path);
  int port() const { return port_; }
  // Runs the loop on the calling thread until stop().
  void run();
  // No new connections; idle ones closed now, busy ones after their response.
  void drain();
  // Closes every connection (one still sending its response gets 2 s); run() returns.
  void stop();
  ServerCounters counters() const;

 private:
  void fit_connections();  // --max-connections within the descriptors the process may open
  void watch_listener();
  void accept_all();
  void refuse(int fd);
  void on_event(const std::shared_ptr<Connection>& c, uint32_t events);
  void probe_half_close(const std::shared_ptr<Connection>& c);
  void read_input(const std::shared_ptr<Connection>& c);
  void process_input(const std::shared_ptr<Connection>& c);
  void dispatch(const std::shared_ptr<Connection>& c);
  void refuse_request(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void flush(const std::shared_ptr<Connection>& c);
  void response_complete(const std::shared_ptr<Connection>& c);
  void watch(Connection& c, uint32_t events);
  void close_connection(const std::shared_ptr<Connection>& c);
  void sweep();
  void apply_control();

  ServerLimits limits_;
  Handler handler_;
  ErrorBody error_body_;
  int epoll_fd_ = -1;
  int listen_fd_ = -1;
  int spare_fd_ = -1;  // given up to accept-and-close when the process is out of descriptors
  int port_ = 0;
  std::string unix_path_;
  std::shared_ptr<Waker> waker_;
  std::unordered_map<uint64_t, std::shared_ptr<Connection>> connections_;
  uint64_t next_id_ = 16;
  bool draining_ = false;
  Clock::time_point stop_deadline_{};
  std::atomic<bool> drain_requested_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<int64_t> open_{0}, accepted_{0}, refused_{0}, timed_out_{0};
};

}  // namespace kettle::server::http
