// AccessPolicy: who may call which route. The Host header must name this
// server (a DNS-rebinding page names its own domain), a browser Origin must
// be the page's own or one --cors-origin allows (a cross-site form or
// text/plain POST needs no preflight, so it is refused here, not only left
// unreadable), every route but the page and /health needs the API key when
// one is set (Bearer or x-api-key, compared in constant time), and /admin/*
// answers loopback clients only unless a key is set.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/http/message.h"

namespace kettle::server {

struct AccessConfig {
  std::vector<std::string> api_keys;       // empty: no key needed
  std::vector<std::string> cors_origins;   // origins besides the page's own; "*": any
  std::vector<std::string> allowed_hosts;  // Host names besides the bound address and loopback names
  std::string bound_host;                  // --host
};

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessConfig config);

  // Throws ApiError (400/403) when the Host or Origin is not one this server answers.
  void check_site(const http::Request& request) const;
  // The CORS headers for a request from an allowed cross-site origin (none for same-site).
  std::vector<http::Header> cors_headers(const http::Request& request) const;
  // Which key the request presents: its index in api_keys (0 when no key is configured).
  // Throws ApiError 401 when a key is needed and missing or wrong.
  int authenticate(const http::Request& request) const;
  // Throws ApiError 403 for /admin/* from another machine when no key is set.
  void check_admin(const http::Request& request) const;

  bool keys_required() const { return !config_.api_keys.empty(); }
  // True when the bound address can be reached from other machines.
  bool exposed() const;

 private:
  bool host_allowed(const std::string& host) const;
  bool origin_allowed(const std::string& origin, const http::Request& request) const;

  AccessConfig config_;
};

}  // namespace kettle::server
