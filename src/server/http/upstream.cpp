#include "server/http/upstream.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "server/http/event_server.h"

namespace kettle::server::http {
namespace {

constexpr size_t kMaxHead = 64 * 1024;
constexpr int kPollMs = 100;

bool hop_by_hop(const std::string& name) {
  static const char* const kNames[] = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                                       "trailer",    "upgrade",    "content-length",   "expect"};
  for (const char* n : kNames)
    if (name == n) return true;
  return name == kForwardedPeer || name == kForwardedLoopback;
}

}  // namespace

std::unique_ptr<Upstream> Upstream::connect(const std::string& path, std::string& why) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    why = "socket path too long";
    return nullptr;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<Upstream>(new Upstream(fd));
}

std::unique_ptr<Upstream> Upstream::connect_tcp(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    why = gai_strerror(rc);
    return nullptr;
  }
  int fd = -1;
  why = "no address";
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return nullptr;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return std::unique_ptr<Upstream>(new Upstream(fd));
}

Upstream::~Upstream() { ::close(fd_); }

std::string Upstream::serialize(const Request& request) {
  std::string out = fmt::format("{} {} HTTP/1.1\r\n", request.method, request.target);
  for (const Header& h : request.headers)
    if (!hop_by_hop(h.name)) out += fmt::format("{}: {}\r\n", h.name, h.value);
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT")
    out += fmt::format("content-length: {}\r\n", request.body.size());
  out += fmt::format("{}: {}\r\n{}: {}\r\nconnection: close\r\n\r\n", kForwardedPeer, request.peer, kForwardedLoopback,
                     request.peer_loopback ? "1" : "0");
  out += request.body;
  return out;
}

bool Upstream::send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool Upstream::fill(double timeout_seconds, const Cancelled& cancelled) {
  if (eof_) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    if (cancelled && cancelled()) return false;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, kPollMs);
    if (ready < 0 && errno != EINTR) return false;
    if (ready > 0) {
      char data[16384];
      const ssize_t n = ::recv(fd_, data, sizeof data, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        eof_ = true;
        return false;
      }
      buffer_.append(data, static_cast<size_t>(n));
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
}

bool Upstream::read_head(Response& head, double timeout_seconds, const Cancelled& cancelled, bool head_request) {
  size_t end = std::string::npos;
  while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (buffer_.size() > kMaxHead || !fill(timeout_seconds, cancelled)) return false;
  }
  const std::string text = buffer_.substr(0, end);
  buffer_.erase(0, end + 4);
  size_t line_end = text.find("\r\n");
  const std::string status_line = text.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return false;
  head = Response();
  head.status = std::atoi(status_line.c_str() + 9);
  if (head.status < 100 || head.status > 599) return false;
  std::string transfer, length;
  while (line_end != std::string::npos) {
    const size_t from = line_end + 2, next = text.find("\r\n", from);
    const std::string line = text.substr(from, next == std::string::npos ? std::string::npos : next - from);
    line_end = next;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string_view text_line(line);
    const std::string name = lower_ascii(trim_ows(text_line.substr(0, colon)));
    const std::string value(trim_ows(text_line.substr(colon + 1)));
    if (name == "transfer-encoding") transfer = lower_ascii(value);
    if (name == "content-length") length = value;
    if (!hop_by_hop(name)) head.headers.push_back({name, value});
  }
  if (head_request || head.status == 204 || head.status == 304 || head.status < 200) {
    mode_ = Body::kNone;
  } else if (transfer.find("chunked") != std::string::npos) {
    mode_ = Body::kChunked;
  } else if (!length.empty()) {
    mode_ = Body::kLength;
    remaining_ = std::strtoull(length.c_str(), nullptr, 10);
  } else {
    mode_ = Body::kUntilClose;
  }
  return true;
}

bool Upstream::read_body(std::string& piece, bool& done, const Cancelled& cancelled) {
  piece.clear();
  done = false;
  constexpr double kForever = 1e9;  // a stream may be quiet for long; the client's leaving ends the wait
  switch (mode_) {
    case Body::kNone:
      done = true;
      return true;
    case Body::kLength:
      if (remaining_ == 0) {
        done = true;
        return true;
      }
      if (buffer_.empty() && !fill(kForever, cancelled)) return false;
      piece = buffer_.substr(0, remaining_);
      buffer_.erase(0, piece.size());
      remaining_ -= piece.size();
      done = remaining_ == 0;
      return true;
    case Body::kUntilClose:
      if (buffer_.empty() && !fill(kForever, cancelled)) {
        done = eof_;
        return eof_;
      }
      piece.swap(buffer_);
      return true;
    case Body::kChunked:
      return read_chunked(piece, done, cancelled);
  }
  return false;
}

bool Upstream::read_chunked(std::string& piece, bool& done, const Cancelled& cancelled) {
  constexpr double kForever = 1e9;
  size_t line = std::string::npos;
  while ((line = buffer_.find("\r\n")) == std::string::npos) {
    if (buffer_.size() > kMaxHead || !fill(kForever, cancelled)) return false;
  }
  const size_t size = std::strtoull(buffer_.c_str(), nullptr, 16);
  if (size == 0) {  // the last chunk; trailers (none from our servers) end with a blank line
    done = true;
    return true;
  }
  while (buffer_.size() < line + 2 + size + 2)
    if (!fill(kForever, cancelled)) return false;
  piece = buffer_.substr(line + 2, size);
  buffer_.erase(0, line + 2 + size + 2);
  return true;
}

}  // namespace kettle::server::http
