#include "server/http/event_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/log.h"

namespace kettle::server::http {
namespace {

constexpr uint64_t kListenId = 1;
constexpr uint64_t kWakeId = 2;
constexpr uint64_t kControlId = 3;  // woken ids at or below this are loop controls, not connections
constexpr auto kSweepEvery = std::chrono::milliseconds(100);
constexpr double kLingerSeconds = 2.0;

double seconds_since(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration<double>(now - t).count();
}

bool is_loopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_UNIX) return true;  // a unix socket's peers are on this machine
  if (addr.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr.s_addr) >> 24) == 127;
  if (addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

std::string address_text(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_UNIX) return "unix";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  else if (addr.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text, sizeof text);
  return text;
}

}  // namespace

// A request that came through a unix socket from a supervising parent (`serve --isolate`)
// names the client the parent accepted; only there, so a TCP client cannot claim another
// address. The parent always sets both headers, whatever its client sent.
void forwarded_peer(Request& request) {
  if (request.peer != "unix") return;
  const std::string* peer = request.header(kForwardedPeer);
  const std::string* loopback = request.header(kForwardedLoopback);
  if (!peer || !loopback) return;
  request.peer = *peer;
  request.peer_loopback = *loopback == "1";
}

namespace {

// As many descriptors as the hard limit allows: each connection holds one.
int raise_descriptor_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur > (1u << 30) ? (1 << 30) : static_cast<int>(lim.rlim_cur);
}

}  // namespace

EventServer::EventServer(ServerLimits limits, Handler handler, ErrorBody error_body)
    : limits_(limits), handler_(std::move(handler)), error_body_(std::move(error_body)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (epoll_fd_ < 0) fail(ErrorCategory::kInternal, "serve: cannot create the event loop: {}", std::strerror(errno));
  waker_ = std::make_shared<Waker>();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, waker_->fd(), &ev);
}

EventServer::~EventServer() {
  for (auto& [id, c] : connections_) {
    {
      std::lock_guard lock(c->mutex);
      c->closed = true;
    }
    c->drained.notify_all();
    ::close(c->fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
  if (spare_fd_ >= 0) ::close(spare_fd_);
  ::close(epoll_fd_);
}

void EventServer::fit_connections() {
  const int descriptors = raise_descriptor_limit();
  if (limits_.max_connections > descriptors - 64) {
    log::warn("serve: --max-connections {} lowered to {} (the process may open {} files)", limits_.max_connections,
              descriptors - 64, descriptors);
    limits_.max_connections = std::max(1, descriptors - 64);
  }
}

void EventServer::watch_listener() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
}

void EventServer::bind_unix(const std::string& path) {
  fit_connections();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    fail(ErrorCategory::kInvalidArgument, "serve: --unix {}: a socket path must be 1 to {} bytes", path,
         sizeof addr.sun_path - 1);
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A socket left by a server that is gone is replaced; any other file is not touched.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) fail(ErrorCategory::kInvalidArgument, "serve: --unix {}: exists and is not a socket", path);
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    if (live) fail(ErrorCategory::kInvalidArgument, "serve: --unix {}: another server is listening there", path);
    ::unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, limits_.backlog) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    fail(ErrorCategory::kInvalidArgument, "serve: cannot listen on unix socket {} ({})", path, why);
  }
  listen_fd_ = fd;
  unix_path_ = path;
  watch_listener();
}

void EventServer::bind(const std::string& host, int port) {
  fit_connections();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    fail(ErrorCategory::kInvalidArgument, "serve: cannot listen on {}:{} ({})", host, port, gai_strerror(rc));
  std::string why;
  for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restart bind past old connections in TIME_WAIT; SO_REUSEPORT is never
    // set, so a second server on the same port is an error instead of a silent split.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, limits_.backlog) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0)
    fail(ErrorCategory::kInvalidArgument, "serve: cannot listen on {}:{} ({})", host, port,
         why.empty() ? "no usable address" : why);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  watch_listener();
}

ServerCounters EventServer::counters() const { return {open_.load(), accepted_.load(), refused_.load(), timed_out_.load()}; }

void EventServer::drain() {
  drain_requested_ = true;
  waker_->wake(kControlId);
}

void EventServer::stop() {
  stop_requested_ = true;
  waker_->wake(kControlId);
}

void EventServer::run() {
  std::vector<epoll_event> events(512);
  auto next_sweep = Clock::now() + kSweepEvery;
  while (!(stop_requested_ && connections_.empty())) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 50);
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenId) {
        accept_all();
      } else if (id == kWakeId) {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t r = ::read(waker_->fd(), &count, sizeof count);
      } else if (auto it = connections_.find(id); it != connections_.end()) {
        on_event(std::shared_ptr<Connection>(it->second), events[i].events);
      }
    }
    for (uint64_t id : waker_->take()) {
      if (id <= kControlId) continue;
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      std::shared_ptr<Connection> c = it->second;
      bool abort = false;
      {
        std::lock_guard lock(c->mutex);
        abort = c->abort;
      }
      if (abort)
        close_connection(c);
      else
        flush(c);
    }
    apply_control();
    if (Clock::now() >= next_sweep) {
      sweep();
      next_sweep = Clock::now() + kSweepEvery;
    }
  }
}

void EventServer::apply_control() {
  if ((drain_requested_ || stop_requested_) && !draining_) {
    draining_ = true;
    if (listen_fd_ >= 0) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
      ::close(listen_fd_);
      listen_fd_ = -1;
    }
  }
  if (!draining_) return;
  if (stop_requested_ && stop_deadline_ == Clock::time_point{}) stop_deadline_ = Clock::now() + std::chrono::seconds(2);
  // Busy connections finish their response (the last bytes of a drained stream); on stop, 2 s at most.
  const bool force = stop_requested_ && Clock::now() >= stop_deadline_;
  std::vector<std::shared_ptr<Connection>> to_close;
  for (auto& [id, c] : connections_)
    if (force || c->phase != Connection::Phase::kHandling) to_close.push_back(c);
  for (auto& c : to_close) close_connection(c);
}

void EventServer::accept_all() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // Out of descriptors: take the connection off the queue and close it, or epoll reports it forever.
        ::close(spare_fd_);
        const int extra = accept(listen_fd_, nullptr, nullptr);
        if (extra >= 0) ::close(extra);
        spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        ++refused_;
        continue;
      }
      return;  // EAGAIN: none left
    }
    if (static_cast<int>(connections_.size()) >= limits_.max_connections) {
      refuse(fd);
      continue;
    }
    const int one = 1;
    if (addr.ss_family != AF_UNIX) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_shared<Connection>(next_id_++, fd, address_text(addr), is_loopback(addr), limits_.parse);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    c->events = ev.events;
    connections_.emplace(c->id, std::move(c));
    ++accepted_;
    ++open_;
  }
}

// Past the connection cap: a short 503 right away (best effort), then the close.
void EventServer::refuse(int fd) {
  ++refused_;
  const std::string body = error_body_(503, fmt::format("the server holds its maximum of {} connections; retry shortly",
                                                        limits_.max_connections));
  Response r(503, "application/json", body);
  r.set_header("Retry-After", "1");
  const std::string bytes = serialize_head(r, 1, false, false, body.size()) + body;
  [[maybe_unused]] ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
}

void EventServer::on_event(const std::shared_ptr<Connection>& c, uint32_t events) {
  if (events & EPOLLERR) return close_connection(c);
  if (events & EPOLLOUT) flush(c);
  if (c->fd < 0 || connections_.find(c->id) == connections_.end()) return;
  if (c->phase == Connection::Phase::kHandling) {
    if (events & EPOLLHUP) return close_connection(c);
    if (events & EPOLLRDHUP) probe_half_close(c);
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) read_input(c);
}

// The client shut its sending side while its request is handled: it has either closed
// altogether (gone: its generation should stop) or only half-closed and waits for the
// reply. TCP cannot tell them apart until we send, so we send: before any byte of the
// response, an interim "100 Continue" (which HTTP/1.1 clients skip); a closed client's
// kernel answers it with a reset, which epoll reports as a hang-up and the connection
// closes. Once the response has begun, its own bytes are the probe. Either way the
// hang-up is not watched for again.
void EventServer::probe_half_close(const std::shared_ptr<Connection>& c) {
  c->keep_alive = false;
  watch(*c, c->events & static_cast<uint32_t>(EPOLLOUT));
  if (c->minor_version == 0) return close_connection(c);  // no interim responses in HTTP/1.0
  if (c->response_bytes_sent == 0) {
    std::lock_guard lock(c->mutex);
    c->out.insert(0, "HTTP/1.1 100 Continue\r\n\r\n");
  }
  flush(c);
}

void EventServer::read_input(const std::shared_ptr<Connection>& c) {
  char buffer[16384];
  for (;;) {
    const ssize_t r = ::recv(c->fd, buffer, sizeof buffer, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close_connection(c);
      return;
    }
    if (r == 0) {  // the client shut its side: nothing more will come
      close_connection(c);
      return;
    }
    c->last_activity = Clock::now();
    if (c->phase == Connection::Phase::kLingering || c->phase == Connection::Phase::kRefusing) continue;
    if (c->in.empty() && !c->parser->started()) c->request_start = c->last_activity;
    c->in.append(buffer, static_cast<size_t>(r));
    process_input(c);
    if (c->phase != Connection::Phase::kReading) return;  // the rest waits in the socket
  }
}

void EventServer::process_input(const std::shared_ptr<Connection>& c) {
  const RequestParser::Status status = c->parser->feed(c->in);
  if (status == RequestParser::Status::kError) return refuse_request(c, c->parser->error_status(), c->parser->error_message());
  if (status == RequestParser::Status::kComplete) return dispatch(c);
  if (!c->continue_sent && c->parser->expects_continue()) {  // curl waits for this before a large body
    c->continue_sent = true;
    {
      std::lock_guard lock(c->mutex);
      c->out += "HTTP/1.1 100 Continue\r\n\r\n";
    }
    flush(c);
  }
}

void EventServer::dispatch(const std::shared_ptr<Connection>& c) {
  Request request = std::move(c->parser->request());
  c->parser.emplace(limits_.parse);
  c->continue_sent = false;
  request.peer = c->peer;
  request.peer_loopback = c->loopback;
  forwarded_peer(request);
  // A client that sent its request and then shut its sending side wants the reply: look for
  // that end-of-stream now, before watching for hang-ups means "gone".
  char probe = 0;
  const bool half_closed = ::recv(c->fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  c->keep_alive = request.wants_keep_alive() && !draining_ && !half_closed;
  c->minor_version = request.minor_version;
  c->response_bytes_sent = 0;
  c->phase = Connection::Phase::kHandling;
  c->phase_since = Clock::now();
  {
    std::lock_guard lock(c->mutex);
    c->close_after = false;
    c->response_done = false;
  }
  watch(*c, half_closed ? 0u : static_cast<uint32_t>(EPOLLRDHUP));
  auto exchange = std::make_shared<Exchange>(c, waker_, std::move(request), c->keep_alive, limits_.stall_seconds);
  try {
    handler_(exchange);
  } catch (const std::exception& e) {
    if (!exchange->replied())
      exchange->reply(Response(500, "application/json", error_body_(500, fmt::format("internal error: {}", e.what()))));
  }
  // A reply given here on the loop (a quick route) leaves now, before any hang-up is read.
  if (exchange->replied() && connections_.count(c->id)) flush(c);
}

void EventServer::refuse_request(const std::shared_ptr<Connection>& c, int status, const std::string& message) {
  c->phase = Connection::Phase::kRefusing;
  c->phase_since = Clock::now();
  c->keep_alive = false;
  c->in.clear();
  const std::string body = error_body_(status, message);
  Response r(status, "application/json", body);
  {
    std::lock_guard lock(c->mutex);
    c->out += serialize_head(r, 1, false, false, body.size()) + body;
    c->response_done = true;
  }
  flush(c);
}

void EventServer::flush(const std::shared_ptr<Connection>& c) {
  bool pending = false, done = false;
  {
    std::unique_lock lock(c->mutex);
    size_t sent = 0;
    while (sent < c->out.size()) {
      const ssize_t n = ::send(c->fd, c->out.data() + sent, c->out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      lock.unlock();
      close_connection(c);  // the client reset the connection
      return;
    }
    if (sent > 0) {
      c->response_bytes_sent += sent;
      c->out.erase(0, sent);
      c->progress = Clock::now();
    }
    pending = !c->out.empty();
    done = !pending && c->response_done;
  }
  c->drained.notify_all();
  const uint32_t base = c->events & ~static_cast<uint32_t>(EPOLLOUT);
  watch(*c, pending ? base | EPOLLOUT : base);
  if (done) response_complete(c);
}

void EventServer::response_complete(const std::shared_ptr<Connection>& c) {
  bool close_after = false;
  {
    std::lock_guard lock(c->mutex);
    c->response_done = false;
    close_after = c->close_after;
  }
  if (c->phase == Connection::Phase::kRefusing) {
    // Let the client read the error before the close: shut our side, drop what it still sends.
    ::shutdown(c->fd, SHUT_WR);
    c->phase = Connection::Phase::kLingering;
    c->phase_since = Clock::now();
    watch(*c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  if (!c->keep_alive || close_after || draining_) return close_connection(c);
  c->phase = Connection::Phase::kReading;
  c->phase_since = c->request_start = c->last_activity = Clock::now();
  watch(*c, EPOLLIN | EPOLLRDHUP);
  if (!c->in.empty()) process_input(c);  // a request pipelined behind the last one
}

void EventServer::watch(Connection& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  c.events = events;
}

void EventServer::close_connection(const std::shared_ptr<Connection>& c) {
  auto it = connections_.find(c->id);
  if (it == connections_.end()) return;
  {
    std::lock_guard lock(c->mutex);
    c->closed = true;
    c->out.clear();
  }
  c->drained.notify_all();
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  connections_.erase(it);
  --open_;
}

void EventServer::sweep() {
  const auto now = Clock::now();
  std::vector<std::pair<std::shared_ptr<Connection>, int>> expired;  // with a 408 to send, or 0: just close
  for (auto& [id, c] : connections_) {
    switch (c->phase) {
      case Connection::Phase::kReading: {
        const bool started = c->parser->started() || !c->in.empty();
        if (!started) {
          if (seconds_since(c->last_activity, now) > limits_.idle_seconds) expired.emplace_back(c, 0);
        } else if (!c->parser->head_done() ? seconds_since(c->request_start, now) > limits_.header_seconds
                                           : seconds_since(c->request_start, now) > limits_.request_seconds) {
          expired.emplace_back(c, 408);
        }
        break;
      }
      case Connection::Phase::kHandling: {
        std::lock_guard lock(c->mutex);
        if (!c->out.empty() && seconds_since(c->progress, now) > limits_.stall_seconds) expired.emplace_back(c, 0);
        break;
      }
      case Connection::Phase::kRefusing:
      case Connection::Phase::kLingering:
        if (seconds_since(c->phase_since, now) > kLingerSeconds) expired.emplace_back(c, 0);
        break;
    }
  }
  for (auto& [c, status] : expired) {
    ++timed_out_;
    if (status == 408)
      refuse_request(c, 408, "the request did not arrive in time");
    else
      close_connection(c);
  }
}

}  // namespace kettle::server::http
