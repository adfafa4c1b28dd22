// An HTTP/1.x request as the event server hands it to the routes, and the
// response the routes give back. Header names are kept lower-case.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kettle::server::http {

struct Header {
  std::string name;  // lower-case
  std::string value;
};

struct Request {
  std::string method;
  std::string target;  // as sent
  std::string path;    // percent-decoded, without the query
  std::string query;
  int minor_version = 1;  // HTTP/1.<minor_version>
  std::vector<Header> headers;
  std::string body;
  std::string peer;  // the client's address, as text
  bool peer_loopback = false;

  // The first value of a header (name in lower case), or nullptr.
  const std::string* header(std::string_view name) const;
  // HTTP/1.1 keeps the connection unless "Connection: close"; 1.0 only with "keep-alive".
  bool wants_keep_alive() const;
};

struct Response {
  int status = 200;
  std::vector<Header> headers;  // Content-Length and Connection are the server's
  std::string body;

  Response() = default;
  Response(int status, std::string content_type, std::string body);
  Response& set_header(std::string name, std::string value);
  const std::string* header(std::string_view name) const;  // case-insensitive
};

std::string_view reason_phrase(int status);
bool iequals(std::string_view a, std::string_view b);
// A header value without the optional whitespace (spaces, tabs) around it.
std::string_view trim_ows(std::string_view s);
// ASCII lower case (header names).
std::string lower_ascii(std::string_view s);
// The head of a response (status line, headers, blank line) as sent on the wire.
std::string serialize_head(const Response& r, int minor_version, bool keep_alive, bool chunked,
                           std::size_t content_length);

}  // namespace kettle::server::http
