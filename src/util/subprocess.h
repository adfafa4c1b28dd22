// Runs a program and captures its standard output, bounded in time and size:
// stdin is /dev/null, stderr is passed through, and a program still running at
// the deadline (or writing more than max_bytes) is killed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kettle {

struct CapturedRun {
  bool ok = false;   // it ran and exited 0
  std::string out;   // its standard output
  std::string why;   // when not ok: "exit code 2", "timed out after 60 s", ...
};

// argv[0] is the program's path ("/proc/self/exe": this binary).
CapturedRun run_captured(const std::vector<std::string>& argv, double timeout_seconds, size_t max_bytes);

}  // namespace kettle
