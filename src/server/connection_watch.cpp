#include "server/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

namespace kettle::server {
namespace {

// "127.0.0.1"/"::1" and a port as numbers, for comparing with getsockname results.
bool same_endpoint(const sockaddr_storage& addr, const std::string& host, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  int actual_port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    actual_port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    actual_port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  return actual_port == port && host == text;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage local{}, remote{};
  socklen_t local_len = sizeof local, remote_len = sizeof remote;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0) return false;
  return same_endpoint(local, local_addr, local_port) && same_endpoint(remote, remote_addr, remote_port);
}

}  // namespace

ConnectionWatch::ConnectionWatch(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                 int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (matches(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
}

bool ConnectionWatch::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace kettle::server
