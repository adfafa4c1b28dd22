// Terminal output for humans: one line per start-up step, on stderr, so
// stdout stays clean for --json and piped output.
#pragma once

#include <fmt/format.h>

#include <string>

namespace kettle::log {

enum class Level { kQuiet, kInfo, kDebug };

void set_level(Level level);
Level level();
void write_line(Level level, const std::string& line);

template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (level() >= Level::kInfo) write_line(Level::kInfo, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (level() >= Level::kDebug) write_line(Level::kDebug, fmt::format(format, std::forward<Args>(args)...));
}

// Warnings always print, whatever the level: they tell the user something was ignored.
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write_line(Level::kQuiet, "warning: " + fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kettle::log
