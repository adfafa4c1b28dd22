#include "server/access_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace kettle::server {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "Host: name:port" or "[v6]:port" → name (lower case, brackets kept for v6).
std::string host_name(const std::string& host) {
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return lower(close == std::string::npos ? host : host.substr(0, close + 1));
  }
  return lower(host.substr(0, host.find(':')));
}

bool is_loopback_name(const std::string& name) {
  if (name == "localhost" || name == "[::1]" || name == "::1") return true;
  if (name.size() > 10 && name.compare(name.size() - 10, 10, ".localhost") == 0) return true;
  return name.rfind("127.", 0) == 0 && std::all_of(name.begin(), name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}

bool is_wildcard(const std::string& host) { return host == "0.0.0.0" || host == "::" || host == "[::]" || host.empty(); }

// Equal strings take the same time to compare whatever the first difference.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace

AccessPolicy::AccessPolicy(AccessConfig config) : config_(std::move(config)) {
  for (std::string& h : config_.allowed_hosts) h = host_name(h);
  config_.bound_host = lower(config_.bound_host);
}

bool AccessPolicy::exposed() const { return !is_loopback_name(config_.bound_host); }

bool AccessPolicy::host_allowed(const std::string& host) const {
  const std::string name = host_name(host);
  if (is_loopback_name(name)) return true;
  if (is_wildcard(config_.bound_host) && config_.allowed_hosts.empty()) return true;  // any name reaches it
  if (name == config_.bound_host || "[" + config_.bound_host + "]" == name) return true;
  return std::find(config_.allowed_hosts.begin(), config_.allowed_hosts.end(), name) != config_.allowed_hosts.end();
}

bool AccessPolicy::origin_allowed(const std::string& origin, const http::Request& request) const {
  const std::string* host = request.header("host");
  const std::string o = lower(origin);
  if (host && (o == "http://" + lower(*host) || o == "https://" + lower(*host))) return true;  // the page's own
  for (const std::string& allowed : config_.cors_origins)
    if (allowed == "*" || lower(allowed) == o) return true;
  return false;
}

void AccessPolicy::check_site(const http::Request& request) const {
  const std::string* host = request.header("host");
  if (host && !host_allowed(*host))
    throw ApiError(403, fmt::format("the Host header '{}' does not name this server (add it with --allowed-host)", *host));
  const std::string* origin = request.header("origin");
  if (origin && !origin_allowed(*origin, request))
    throw ApiError(403, fmt::format("requests from the origin '{}' are not allowed (add it with --cors-origin)", *origin));
}

std::vector<http::Header> AccessPolicy::cors_headers(const http::Request& request) const {
  const std::string* origin = request.header("origin");
  if (!origin || !origin_allowed(*origin, request)) return {};
  return {{"Access-Control-Allow-Origin", *origin}, {"Vary", "Origin"}};
}

int AccessPolicy::authenticate(const http::Request& request) const {
  if (config_.api_keys.empty()) return 0;
  std::string presented;
  if (const std::string* auth = request.header("authorization"); auth && auth->size() > 7 &&
                                                                  lower(auth->substr(0, 7)) == "bearer ")
    presented = auth->substr(7);
  else if (const std::string* key = request.header("x-api-key"))
    presented = *key;
  if (presented.empty()) throw ApiError(401, "this server needs an API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'", "", "missing_api_key");
  int found = -1;
  for (size_t i = 0; i < config_.api_keys.size(); ++i)  // every key compared, so the time says nothing of which
    if (constant_time_equal(presented, config_.api_keys[i]) && found < 0) found = static_cast<int>(i);
  if (found < 0) throw ApiError(401, "the API key is not valid", "", "invalid_api_key");
  return found;
}

void AccessPolicy::check_admin(const http::Request& request) const {
  if (config_.api_keys.empty() && !request.peer_loopback)
    throw ApiError(403, "/admin routes answer only this machine unless the server has an API key (--api-key)");
}

}  // namespace kettle::server
