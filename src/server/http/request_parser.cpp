#include "server/http/request_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string_view>

namespace kettle::server::http {
namespace {

bool is_token_char(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_token_char(static_cast<unsigned char>(c)); });
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = static_cast<char>(c | 0x20);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The position just past the blank line that ends a head (CRLF CRLF, or bare LFs), or npos.
size_t end_of_head(const std::string& in, size_t from) {
  for (size_t i = from; i < in.size(); ++i) {
    if (in[i] != '\n') continue;
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') return i + 3;
  }
  return std::string::npos;
}

}  // namespace

RequestParser::Status RequestParser::fail(int status, std::string message) {
  phase_ = Phase::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  return Status::kError;
}

RequestParser::Status RequestParser::done() {
  phase_ = Phase::kDone;
  return Status::kComplete;
}

RequestParser::Status RequestParser::feed(std::string& in) {
  if (phase_ == Phase::kDone) return Status::kComplete;
  if (phase_ == Phase::kError) return Status::kError;
  if (phase_ == Phase::kHead) {
    if (!started_) {  // empty lines before a request line are ignored (RFC 9112 §2.2)
      size_t skip = 0;
      while (skip < in.size() && (in[skip] == '\r' || in[skip] == '\n')) ++skip;
      in.erase(0, skip);
      if (in.empty()) return Status::kNeedMore;
      started_ = true;
    }
    const size_t end = end_of_head(in, scanned_ > 2 ? scanned_ - 2 : 0);
    if (end == std::string::npos) {
      scanned_ = in.size();
      if (in.size() > limits_.max_head_bytes)
        return fail(431, fmt::format("the request's head is larger than {} bytes", limits_.max_head_bytes));
      return Status::kNeedMore;
    }
    if (end > limits_.max_head_bytes)
      return fail(431, fmt::format("the request's head is larger than {} bytes", limits_.max_head_bytes));
    const std::string head = in.substr(0, end);
    in.erase(0, end);
    if (Status s = parse_head(head); s == Status::kError) return s;
    if (Status s = choose_framing(); s != Status::kNeedMore) return s;
  }
  if (phase_ == Phase::kLengthBody) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, in.size()));
    request_.body.append(in, 0, take);
    in.erase(0, take);
    remaining_ -= take;
    return remaining_ == 0 ? done() : Status::kNeedMore;
  }
  return feed_chunked(in);
}

RequestParser::Status RequestParser::parse_head(std::string_view head) {
  bool first = true;
  while (!head.empty()) {
    size_t nl = head.find('\n');
    std::string_view line = head.substr(0, nl);
    head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;  // the blank line that ends the head
    Status s = first ? parse_request_line(line) : parse_header_line(line);
    if (s == Status::kError) return s;
    first = false;
  }
  return Status::kNeedMore;
}

RequestParser::Status RequestParser::parse_request_line(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "the request line is not 'METHOD target HTTP/1.x'");
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (!is_token(method)) return fail(400, "the request method is not a token");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || !std::isdigit(static_cast<unsigned char>(version[5])) ||
      !std::isdigit(static_cast<unsigned char>(version[7])))
    return fail(400, "the request line does not end in an HTTP version");
  if (version[5] != '1' || (version[7] != '0' && version[7] != '1'))
    return fail(505, fmt::format("HTTP version {} is not supported (HTTP/1.0 and 1.1 are)", version));
  request_.method = std::string(method);
  request_.minor_version = version[7] - '0';
  request_.target = std::string(target);
  for (unsigned char c : target)
    if (c <= 0x20 || c == 0x7f) return fail(400, "the request target has a control character");

  std::string_view path = target;
  if (path.substr(0, 7) == "http://" || path.substr(0, 8) == "https://") {  // absolute form: keep the path
    const size_t slash = path.find('/', path.find("//") + 2);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  }
  if (path != "*" && (path.empty() || path.front() != '/')) return fail(400, "the request target is not a path");
  const size_t q = path.find('?');
  if (q != std::string_view::npos) {
    request_.query = std::string(path.substr(q + 1));
    path = path.substr(0, q);
  }
  std::string decoded;
  decoded.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      decoded += path[i];
      continue;
    }
    if (i + 2 >= path.size() || hex_value(path[i + 1]) < 0 || hex_value(path[i + 2]) < 0)
      return fail(400, "the request path has a malformed percent escape");
    decoded += static_cast<char>(hex_value(path[i + 1]) * 16 + hex_value(path[i + 2]));
    i += 2;
  }
  request_.path = std::move(decoded);
  return Status::kNeedMore;
}

RequestParser::Status RequestParser::parse_header_line(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') return fail(400, "folded header lines are not accepted");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
    return fail(400, "a header line is not 'Name: value'");
  if (request_.headers.size() >= limits_.max_headers)
    return fail(431, fmt::format("the request has more than {} headers", limits_.max_headers));
  const std::string_view value = trim_ows(line.substr(colon + 1));
  for (unsigned char c : value)
    if ((c < 0x20 && c != '\t') || c == 0x7f) return fail(400, "a header value has a control character");
  request_.headers.push_back({lower_ascii(line.substr(0, colon)), std::string(value)});
  return Status::kNeedMore;
}

RequestParser::Status RequestParser::choose_framing() {
  const std::string* length = nullptr;
  const std::string* coding = nullptr;
  for (const Header& h : request_.headers) {
    if (h.name == "content-length") {
      if (length && *length != h.value) return fail(400, "the request has two different Content-Length headers");
      length = &h.value;
    } else if (h.name == "transfer-encoding") {
      if (coding) return fail(400, "the request has two Transfer-Encoding headers");
      coding = &h.value;
    } else if (h.name == "expect") {
      if (!iequals(h.value, "100-continue")) return fail(417, fmt::format("Expect: {} is not supported", h.value));
      expect_continue_ = true;
    }
  }
  if (request_.minor_version == 1 && !request_.header("host")) return fail(400, "an HTTP/1.1 request needs a Host header");
  if (coding) {
    if (length) return fail(400, "the request has both Content-Length and Transfer-Encoding");
    if (!iequals(*coding, "chunked"))
      return fail(501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", *coding));
    phase_ = Phase::kChunkSize;
    return Status::kNeedMore;
  }
  if (!length) return done();
  if (length->empty() || length->size() > 18 ||
      !std::all_of(length->begin(), length->end(), [](char c) { return c >= '0' && c <= '9'; }))
    return fail(400, "the Content-Length header is not a number");
  remaining_ = std::stoull(*length);
  if (remaining_ > limits_.max_body_bytes)
    return fail(413, fmt::format("the request body is larger than the server accepts ({} bytes)", limits_.max_body_bytes));
  if (remaining_ == 0) return done();
  phase_ = Phase::kLengthBody;
  return Status::kNeedMore;
}

RequestParser::Status RequestParser::feed_chunked(std::string& in) {
  constexpr size_t kMaxSizeLine = 1024;
  size_t pos = 0;
  auto consume = [&] { in.erase(0, pos); };
  while (true) {
    if (phase_ == Phase::kChunkSize || phase_ == Phase::kChunkEnd || phase_ == Phase::kTrailers) {
      const size_t nl = in.find('\n', pos);
      if (nl == std::string::npos) {
        const size_t pending = in.size() - pos;
        consume();
        if (phase_ == Phase::kTrailers ? trailer_bytes_ + pending > limits_.max_head_bytes : pending > kMaxSizeLine)
          return fail(phase_ == Phase::kTrailers ? 431 : 400, "a chunked body's framing line is too long");
        return Status::kNeedMore;
      }
      std::string_view line(in.data() + pos, nl - pos);
      pos = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (phase_ == Phase::kChunkEnd) {
        if (!line.empty()) return fail(400, "a chunk's data is longer than its size");
        phase_ = Phase::kChunkSize;
        continue;
      }
      if (phase_ == Phase::kTrailers) {
        trailer_bytes_ += line.size() + 2;
        if (trailer_bytes_ > limits_.max_head_bytes) return fail(431, "the chunked body's trailers are too large");
        if (line.empty()) {
          consume();
          return done();
        }
        continue;  // trailer fields are read and dropped
      }
      if (line.size() > kMaxSizeLine) return fail(400, "a chunked body's size line is too long");
      const std::string_view digits = trim_ows(line.substr(0, line.find(';')));
      if (digits.empty() || digits.size() > 15) return fail(400, "a chunk size is not a hexadecimal number");
      uint64_t size = 0;
      for (char c : digits) {
        const int v = hex_value(c);
        if (v < 0) return fail(400, "a chunk size is not a hexadecimal number");
        size = size * 16 + static_cast<uint64_t>(v);
      }
      if (request_.body.size() + size > limits_.max_body_bytes)
        return fail(413, fmt::format("the request body is larger than the server accepts ({} bytes)", limits_.max_body_bytes));
      if (size == 0) {
        phase_ = Phase::kTrailers;
        continue;
      }
      remaining_ = size;
      phase_ = Phase::kChunkData;
    }
    if (phase_ == Phase::kChunkData) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, in.size() - pos));
      request_.body.append(in, pos, take);
      pos += take;
      remaining_ -= take;
      if (remaining_ > 0) {
        consume();
        return Status::kNeedMore;
      }
      phase_ = Phase::kChunkEnd;
    }
  }
}

}  // namespace kettle::server::http
