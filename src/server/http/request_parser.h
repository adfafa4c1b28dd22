// RequestParser: reads one HTTP/1.x request from bytes as they arrive, with
// every part bounded: the head (request line and headers) in bytes and in
// header count, the body in bytes whatever its framing (Content-Length or
// chunked). It owns no socket, so the fuzz pass and the unit tests drive it
// directly. Ambiguous framing (both lengths, differing lengths, an unknown
// transfer coding, folded header lines) is refused, never guessed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http/message.h"

namespace kettle::server::http {

struct ParseLimits {
  size_t max_head_bytes = 16 << 10;  // request line + headers (and, separately, chunked trailers)
  size_t max_headers = 64;
  size_t max_body_bytes = 8 << 20;
};

class RequestParser {
 public:
  enum class Status { kNeedMore, kComplete, kError };

  explicit RequestParser(const ParseLimits& limits) : limits_(limits) {}

  // Consumes bytes from the front of `in` (what it used is erased; bytes of a next,
  // pipelined request stay). Once kComplete or kError, consumes nothing more.
  Status feed(std::string& in);

  bool started() const { return started_; }
  bool head_done() const { return phase_ > Phase::kHead; }
  // The head asked for "Expect: 100-continue" and a body is still to come.
  bool expects_continue() const { return expect_continue_ && phase_ > Phase::kHead && phase_ < Phase::kDone; }
  Request& request() { return request_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Phase { kHead, kLengthBody, kChunkSize, kChunkData, kChunkEnd, kTrailers, kDone, kError };

  Status fail(int status, std::string message);
  Status parse_head(std::string_view head);
  Status parse_request_line(std::string_view line);
  Status parse_header_line(std::string_view line);
  Status choose_framing();
  Status feed_chunked(std::string& in);
  Status done();

  const ParseLimits& limits_;
  Phase phase_ = Phase::kHead;
  Request request_;
  bool started_ = false;
  bool expect_continue_ = false;
  size_t scanned_ = 0;         // head bytes already searched for the blank line
  uint64_t remaining_ = 0;     // body bytes (kLengthBody) or chunk bytes (kChunkData) still to read
  size_t trailer_bytes_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace kettle::server::http
