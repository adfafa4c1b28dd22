#include "server/engine_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string_view>
#include <utility>

#include "server/http/upstream.h"
#include "util/log.h"

namespace kettle::server {
namespace {

constexpr double kQuickDeathSeconds = 10;  // a child that lived less than this waits before its restart
constexpr double kBackoffSeconds = 5;
constexpr int kRestartsPerMinute = 3;
constexpr auto kPoll = std::chrono::milliseconds(100);
// A ready child is asked GET /health every kWatchdogSeconds, each ask given as long to answer;
// one that answers nothing kWatchdogMisses times in a row (stopped, or its server stuck) is
// killed, and restarted as a child that died. Any answer, 503 included, counts as alive.
constexpr int kWatchdogSeconds = 5;
constexpr int kWatchdogMisses = 3;

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

}  // namespace

const char* engine_state_name(EngineState s) {
  switch (s) {
    case EngineState::kStarting: return "starting";
    case EngineState::kReady: return "ready";
    case EngineState::kBackoff: return "restarting";
    case EngineState::kDown: return "down";
    case EngineState::kStopped: return "stopped";
  }
  return "unknown";
}

std::string EngineStatus::json() const {
  nlohmann::json j = {{"state", engine_state_name(state)},
                      {"pid", pid == 0 ? nlohmann::json(nullptr) : nlohmann::json(pid)},
                      {"restarts", restarts},
                      {"uptime_seconds", uptime_seconds},
                      {"last_exit", last_exit.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_exit)}};
  return j.dump();
}

EngineSupervisor::EngineSupervisor(std::vector<std::string> argv, std::string socket)
    : argv_(std::move(argv)), socket_(std::move(socket)) {}

EngineSupervisor::~EngineSupervisor() { stop(5); }

void EngineSupervisor::start() { monitor_ = std::thread([this] { monitor(); }); }

void EngineSupervisor::set_state(EngineState s) {
  {
    std::lock_guard lock(mutex_);
    state_ = s;
  }
  changed_.notify_all();
}

bool EngineSupervisor::sleep_unless_stopping(double seconds) {
  std::unique_lock lock(mutex_);
  return !changed_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stopping_; });
}

int EngineSupervisor::spawn() {
  std::vector<char*> args;
  for (std::string& a : argv_) args.push_back(a.data());
  args.push_back(nullptr);
  // The environment as it is, plus the child's mark (built before fork: the child only execs).
  std::string mark = std::string(kEngineChildEnv) + "=1";
  std::vector<char*> env;
  for (char** e = environ; *e; ++e)
    if (std::string_view(*e).rfind(std::string(kEngineChildEnv) + "=", 0) != 0) env.push_back(*e);
  env.push_back(mark.data());
  env.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before the line above
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    execve("/proc/self/exe", args.data(), env.data());
    _exit(127);
  }
  return pid > 0 ? pid : 0;
}

int EngineSupervisor::health_status(double seconds) const {
  std::string why;
  auto up = http::Upstream::connect(socket_, why);
  if (!up || !up->send("GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")) return 0;
  http::Response head;
  return up->read_head(head, seconds, nullptr, false) ? head.status : 0;
}

bool EngineSupervisor::wait_child(int pid) {
  int misses = 0;
  auto next_ask = Clock::now();
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exit_status_ = status;
      return true;
    }
    EngineState state;
    {
      std::lock_guard lock(mutex_);
      state = stopping_ ? EngineState::kStopped : state_;
    }
    if (state == EngineState::kStarting && health_status(2.0) == 200) {
      set_state(EngineState::kReady);
      log::info("engine: child {} is ready", pid);
      next_ask = Clock::now() + std::chrono::seconds(kWatchdogSeconds);
    } else if (state == EngineState::kReady && Clock::now() >= next_ask) {
      misses = health_status(kWatchdogSeconds) > 0 ? 0 : misses + 1;
      next_ask = Clock::now() + std::chrono::seconds(kWatchdogSeconds);
      if (misses >= kWatchdogMisses) {
        log::warn("engine: child {} answered no /health {} times in a row (about {} s); killing it", pid, misses,
                  2 * kWatchdogSeconds * misses);
        {
          std::lock_guard lock(mutex_);
          watchdog_killed_ = true;
        }
        kill(pid, SIGKILL);
        misses = 0;
      }
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void EngineSupervisor::monitor() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        state_ = EngineState::kStopped;
        changed_.notify_all();
        return;
      }
    }
    const int pid = spawn();
    {
      std::lock_guard lock(mutex_);
      pid_ = pid;
      child_started_ = Clock::now();
      state_ = EngineState::kStarting;
    }
    changed_.notify_all();
    if (pid > 0) {
      log::info("engine: started child {} ({})", pid, socket_);
      wait_child(pid);
    } else {
      exit_status_ = -1;
    }
    std::unique_lock lock(mutex_);
    pid_ = 0;
    last_exit_ = pid > 0 ? describe_exit(exit_status_) : "could not start (fork failed)";
    if (std::exchange(watchdog_killed_, false)) last_exit_ += ", by the watchdog: it stopped answering /health";
    if (stopping_) {
      state_ = EngineState::kStopped;
      changed_.notify_all();
      return;
    }
    const auto now = Clock::now();
    const double lived = std::chrono::duration<double>(now - child_started_).count();
    while (!recent_restarts_.empty() && now - recent_restarts_.front() > std::chrono::minutes(1))
      recent_restarts_.pop_front();
    if (static_cast<int>(recent_restarts_.size()) >= kRestartsPerMinute) {
      state_ = EngineState::kDown;
      changed_.notify_all();
      log::warn("engine: the child ended ({}) after {} restarts within a minute; the engine is down", last_exit_,
                 kRestartsPerMinute);
      return;
    }
    state_ = EngineState::kBackoff;
    changed_.notify_all();
    log::warn("engine: the child ended ({}) after {:.1f} s; starting another{}", last_exit_, lived,
              lived < kQuickDeathSeconds ? fmt::format(" in {:.0f} s", kBackoffSeconds) : "");
    lock.unlock();
    if (lived < kQuickDeathSeconds && !sleep_unless_stopping(kBackoffSeconds)) {
      set_state(EngineState::kStopped);
      return;
    }
    lock.lock();
    if (stopping_) {
      state_ = EngineState::kStopped;
      changed_.notify_all();
      return;
    }
    recent_restarts_.push_back(Clock::now());
    ++restarts_;
  }
}

bool EngineSupervisor::wait_ready(double seconds, const std::function<bool()>& cancelled) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::unique_lock lock(mutex_);
  for (;;) {
    if (state_ == EngineState::kReady) return true;
    if (state_ == EngineState::kDown || state_ == EngineState::kStopped || stopping_) return false;
    if (Clock::now() >= deadline || (cancelled && cancelled())) return false;
    changed_.wait_for(lock, kPoll);
  }
}

EngineStatus EngineSupervisor::status() const {
  std::lock_guard lock(mutex_);
  EngineStatus s;
  s.state = state_;
  s.pid = pid_;
  s.restarts = restarts_;
  s.last_exit = last_exit_;
  if (pid_ > 0) s.uptime_seconds = std::chrono::duration<double>(Clock::now() - child_started_).count();
  return s;
}

void EngineSupervisor::stop(double seconds) {
  // One stop at a time (a pool evicting this engine while the server shuts down): a second
  // waits for the first and finds nothing left to do.
  std::lock_guard stopping(stop_mutex_);
  int pid = 0;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !monitor_.joinable()) return;
    stopping_ = true;
    pid = pid_;
  }
  changed_.notify_all();
  if (pid > 0) {
    kill(pid, SIGTERM);
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return pid_ == 0; })) {
      log::warn("engine: child {} still running {:.0f} s after SIGTERM; killing it", pid, seconds);
      kill(pid, SIGKILL);
    }
  }
  if (monitor_.joinable()) monitor_.join();
}

}  // namespace kettle::server
