// Log sink: stderr, line-buffered, thread-safe.
#include "util/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace kettle::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mutex;
}  // namespace

void set_level(Level level) { g_level = level; }
Level level() { return g_level; }

void write_line(Level, const std::string& line) {
  std::lock_guard lock(g_mutex);
  std::fputs(line.c_str(), stderr);
  std::fputc('\n', stderr);
}

}  // namespace kettle::log
