// EngineSupervisor: the engine child of `serve --isolate` — the same binary
// run as `serve ... --unix SOCKET` — started, watched and restarted by the
// parent, which never touches the GPU. The child is ready once its /health
// answers 200 on the socket. A child that dies is started again, after 5 s
// when it lived less than 10 s; past 3 restarts within a minute the engine is
// reported down and left so (a model that cannot load fails the same way
// every time). A ready child that stops answering /health (three asks 5 s
// apart, each given 5 s) is killed and restarted the same way. The child gets
// SIGTERM if the parent dies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kettle::server {

// Set in the child's environment: a child refuses --isolate (no child of a child).
inline constexpr const char* kEngineChildEnv = "KETTLE_ENGINE_CHILD";

enum class EngineState { kStarting, kReady, kBackoff, kDown, kStopped };
const char* engine_state_name(EngineState s);

struct EngineStatus {
  EngineState state = EngineState::kStarting;
  int pid = 0;               // the running child, 0 when none
  int restarts = 0;          // since the parent started
  double uptime_seconds = 0;  // of the running child
  std::string last_exit;     // how the last child ended ("exit code 1", "signal 9"), empty before any did
  std::string json() const;  // GET /engine's body
};

class EngineSupervisor {
 public:
  // argv: the child's command line (argv[0] the binary); socket: where it listens.
  EngineSupervisor(std::vector<std::string> argv, std::string socket);
  ~EngineSupervisor();  // stops the child (stop())

  void start();
  // Blocks until the engine is ready (true), or down or stopped, `seconds` pass, or
  // cancelled() says so (false).
  bool wait_ready(double seconds, const std::function<bool()>& cancelled);
  EngineStatus status() const;
  const std::string& socket() const { return socket_; }
  // No more restarts; SIGTERM to the child and up to `seconds` for it to exit, then SIGKILL.
  // Safe from several threads at once.
  void stop(double seconds);

 private:
  using Clock = std::chrono::steady_clock;
  void monitor();
  int spawn();                            // the child's pid (0: fork failed)
  bool wait_child(int pid);               // until it exits (true) or it is ready / stopping
  int health_status(double seconds) const;  // GET /health on the socket: its status, 0 for no answer in time
  void set_state(EngineState s);
  bool sleep_unless_stopping(double seconds);  // false: stop() came

  std::vector<std::string> argv_;
  std::string socket_;
  mutable std::mutex mutex_;
  std::mutex stop_mutex_;  // held through stop()
  std::condition_variable changed_;
  EngineState state_ = EngineState::kStarting;
  int pid_ = 0;
  int restarts_ = 0;
  Clock::time_point child_started_{};
  std::string last_exit_;
  std::deque<Clock::time_point> recent_restarts_;
  bool stopping_ = false;
  int exit_status_ = 0;  // the reaped child's wait status, for last_exit_
  bool watchdog_killed_ = false;  // the running child was killed for not answering
  std::thread monitor_;
};

}  // namespace kettle::server
