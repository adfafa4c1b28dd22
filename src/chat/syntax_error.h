// Template-compile errors: a syntax error (kInvalidData) or a Jinja feature
// kettle does not implement (kUnsupported), both naming the template line.
// ChatTemplate prefixes the template's origin (file path) to the message.
#pragma once

#include <fmt/format.h>

#include "util/error.h"

namespace kettle::jinja {

template <typename... Args>
[[noreturn]] void syntax_error(int line, fmt::format_string<Args...> format, Args&&... args) {
  fail(ErrorCategory::kInvalidData, "syntax error at line {}: {}", line,
       fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void unsupported(int line, fmt::format_string<Args...> format, Args&&... args) {
  fail(ErrorCategory::kUnsupported, "unsupported Jinja feature at line {}: {}", line,
       fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kettle::jinja
