// kettle::Error: the one exception type thrown at boundaries (files, flags,
// requests). Its category maps to a process exit code and an HTTP status.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kettle {

enum class ErrorCategory {
  kInvalidArgument,  // a flag, request field or prompt the user gave is wrong
  kNotFound,         // a file, folder or model that does not exist
  kInvalidData,      // a file exists but its contents are malformed
  kUnsupported,      // well-formed input that kettle does not handle (yet)
  kResourceExhausted,
  kInternal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, std::string message)
      : std::runtime_error(std::move(message)), category_(category) {}

  ErrorCategory category() const { return category_; }
  int exit_code() const;
  int http_status() const;

 private:
  ErrorCategory category_;
};

std::string_view category_name(ErrorCategory category);

template <typename... Args>
[[noreturn]] void fail(ErrorCategory category, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(category, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kettle
