#include "server/http/connection.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace kettle::server::http {

Waker::Waker() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) fail(ErrorCategory::kInternal, "serve: cannot create the event loop's eventfd: {}", std::strerror(errno));
}

Waker::~Waker() { ::close(fd_); }

void Waker::wake(uint64_t connection_id) {
  {
    std::lock_guard lock(mutex_);
    woken_.push_back(connection_id);
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
}

std::vector<uint64_t> Waker::take() {
  std::lock_guard lock(mutex_);
  std::vector<uint64_t> out;
  out.swap(woken_);
  return out;
}

}  // namespace kettle::server::http
