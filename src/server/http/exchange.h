// Exchange: one request and the one response to it, as a route handler sees
// them. The handler may answer on the event loop's thread or on its own; it
// replies once, whole, or starts a stream and writes it piece by piece. A
// write blocks while the client is slow to read (a bounded outbox) and fails
// once the client has gone, which is how a generation learns to stop.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/connection.h"
#include "server/http/message.h"

namespace kettle::server::http {

class Exchange {
 public:
  Exchange(std::shared_ptr<Connection> connection, std::shared_ptr<Waker> waker, Request request, bool keep_alive,
           double stall_seconds);
  ~Exchange();  // a handler that never replied: 500; a stream never finished: the connection is cut
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const Request& request() const { return request_; }
  // Headers every response of this exchange carries (CORS, security), set before replying.
  void add_header(std::string name, std::string value);

  void reply(Response response);
  // The status and headers now; the body follows through write() and finish().
  void start_stream(Response head);
  bool write(std::string_view data);  // false: the client is gone (stop producing)
  void finish();
  bool client_gone() const;
  bool replied() const { return replied_; }

 private:
  bool send(std::string bytes, bool last);

  std::shared_ptr<Connection> connection_;
  std::shared_ptr<Waker> waker_;
  Request request_;
  std::vector<Header> extra_headers_;
  bool keep_alive_;
  double stall_seconds_;
  bool replied_ = false;
  bool streaming_ = false;
  bool finished_ = false;
};

}  // namespace kettle::server::http
