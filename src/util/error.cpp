// Exit codes and HTTP statuses for each error category.
#include "util/error.h"

namespace kettle {

int Error::exit_code() const {
  switch (category_) {
    case ErrorCategory::kInvalidArgument: return 2;
    case ErrorCategory::kNotFound: return 3;
    case ErrorCategory::kInvalidData: return 4;
    case ErrorCategory::kUnsupported: return 5;
    case ErrorCategory::kResourceExhausted: return 6;
    case ErrorCategory::kInternal: return 70;
  }
  return 1;
}

int Error::http_status() const {
  switch (category_) {
    case ErrorCategory::kInvalidArgument: return 400;
    case ErrorCategory::kNotFound: return 404;
    case ErrorCategory::kInvalidData: return 400;
    case ErrorCategory::kUnsupported: return 400;
    case ErrorCategory::kResourceExhausted: return 429;
    case ErrorCategory::kInternal: return 500;
  }
  return 500;
}

std::string_view category_name(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInvalidArgument: return "invalid argument";
    case ErrorCategory::kNotFound: return "not found";
    case ErrorCategory::kInvalidData: return "invalid data";
    case ErrorCategory::kUnsupported: return "unsupported";
    case ErrorCategory::kResourceExhausted: return "resource exhausted";
    case ErrorCategory::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace kettle
