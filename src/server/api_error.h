// ApiError: an error a client caused (or the server hit) on its way to the HTTP
// response, with the status, the offending field and a machine-readable code.
// Each protocol writes it in its own shape (openai_protocol.h, anthropic_protocol.h).
#pragma once

#include <stdexcept>
#include <string>

namespace kettle::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

}  // namespace kettle::server
