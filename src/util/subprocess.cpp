#include "util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace kettle {

CapturedRun run_captured(const std::vector<std::string>& argv, double timeout_seconds, size_t max_bytes) {
  CapturedRun run;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    run.why = fmt::format("pipe: {}", std::strerror(errno));
    return run;
  }
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(pipe_fds[1], 1);
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  if (pid < 0) {
    close(pipe_fds[0]);
    run.why = fmt::format("fork: {}", std::strerror(errno));
    return run;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  bool killed = false;
  char buffer[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.why = fmt::format("timed out after {:.0f} s", timeout_seconds);
      killed = true;
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the program closed its output (it exits)
    run.out.append(buffer, static_cast<size_t>(n));
    if (run.out.size() > max_bytes) {
      run.why = fmt::format("wrote more than {} bytes", max_bytes);
      killed = true;
      break;
    }
  }
  close(pipe_fds[0]);
  int status = 0;
  // Its output closed: it exits now, or is killed at the deadline.
  while (!killed && waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      run.why = fmt::format("timed out after {:.0f} s", timeout_seconds);
      killed = true;
      break;
    }
    usleep(10000);
  }
  if (killed) {
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (killed) return run;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    run.ok = true;
  } else if (WIFEXITED(status)) {
    run.why = fmt::format("exit code {}", WEXITSTATUS(status));
  } else {
    run.why = fmt::format("signal {}", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  return run;
}

}  // namespace kettle
