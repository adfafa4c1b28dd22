#include "server/http/message.h"

#include <fmt/format.h>

#include <cctype>

namespace kettle::server::http {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const std::string* Request::header(std::string_view name) const {
  for (const Header& h : headers)
    if (h.name == name) return &h.value;
  return nullptr;
}

namespace {

// Whether a comma-separated header value lists `token` (case-insensitive).
bool lists_token(const std::string& value, std::string_view token) {
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string_view item(value.data() + start, end - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (iequals(item, token)) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

bool Request::wants_keep_alive() const {
  const std::string* connection = header("connection");
  if (minor_version == 0) return connection && lists_token(*connection, "keep-alive");
  return !(connection && lists_token(*connection, "close"));
}

Response::Response(int status_code, std::string content_type, std::string content) : status(status_code), body(std::move(content)) {
  set_header("Content-Type", std::move(content_type));
}

Response& Response::set_header(std::string name, std::string value) {
  for (Header& h : headers)
    if (iequals(h.name, name)) {
      h.value = std::move(value);
      return *this;
    }
  headers.push_back({std::move(name), std::move(value)});
  return *this;
}

const std::string* Response::header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return &h.value;
  return nullptr;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

std::string serialize_head(const Response& r, int minor_version, bool keep_alive, bool chunked,
                           std::size_t content_length) {
  std::string out = fmt::format("HTTP/1.{} {} {}\r\n", minor_version, r.status, reason_phrase(r.status));
  for (const Header& h : r.headers) out += fmt::format("{}: {}\r\n", h.name, h.value);
  if (chunked)
    out += "Transfer-Encoding: chunked\r\n";
  else if (content_length != std::string::npos)
    out += fmt::format("Content-Length: {}\r\n", content_length);
  out += keep_alive ? (minor_version == 0 ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

}  // namespace kettle::server::http
