#include "server/http/exchange.h"

#include <fmt/format.h>

namespace kettle::server::http {

namespace {
constexpr size_t kOutboxHighWater = 1 << 20;  // a stream's writer waits past this many unsent bytes
}

Exchange::Exchange(std::shared_ptr<Connection> connection, std::shared_ptr<Waker> waker, Request request,
                   bool keep_alive, double stall_seconds)
    : connection_(std::move(connection)),
      waker_(std::move(waker)),
      request_(std::move(request)),
      keep_alive_(keep_alive),
      stall_seconds_(stall_seconds) {}

Exchange::~Exchange() {
  if (!replied_) {
    reply(Response(500, "application/json", R"({"error":{"message":"the request ended without a response","type":"server_error"}})"));
  } else if (streaming_ && !finished_) {
    {
      std::lock_guard lock(connection_->mutex);
      connection_->abort = true;
    }
    waker_->wake(connection_->id);
  }
}

void Exchange::add_header(std::string name, std::string value) { extra_headers_.push_back({std::move(name), std::move(value)}); }

bool Exchange::send(std::string bytes, bool last) {
  {
    std::lock_guard lock(connection_->mutex);
    if (connection_->closed) return false;
    if (!keep_alive_) connection_->close_after = true;
    if (connection_->out.empty()) connection_->progress = Clock::now();  // the stall clock starts now
    connection_->out += bytes;
    if (last) connection_->response_done = true;
  }
  waker_->wake(connection_->id);
  return true;
}

void Exchange::reply(Response response) {
  if (replied_) return;
  replied_ = true;
  for (Header& h : extra_headers_) response.headers.push_back(h);
  const bool bodiless = response.status == 204 || response.status == 304 || response.status < 200;
  std::string bytes = serialize_head(response, request_.minor_version, keep_alive_, false,
                                     bodiless ? std::string::npos : response.body.size());
  if (request_.method != "HEAD" && !bodiless) bytes += response.body;
  send(std::move(bytes), true);
}

void Exchange::start_stream(Response head) {
  if (replied_) return;
  replied_ = streaming_ = true;
  for (Header& h : extra_headers_) head.headers.push_back(h);
  // HTTP/1.0 has no chunked coding: the body ends when the connection closes.
  const bool chunked = request_.minor_version == 1;
  if (!chunked) keep_alive_ = false;
  send(serialize_head(head, request_.minor_version, keep_alive_, chunked, std::string::npos), false);
}

bool Exchange::write(std::string_view data) {
  if (!streaming_ || finished_) return false;
  if (data.empty()) return !client_gone();
  {
    std::unique_lock lock(connection_->mutex);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_seconds_));
    const bool room = connection_->drained.wait_until(
        lock, deadline, [&] { return connection_->closed || connection_->out.size() < kOutboxHighWater; });
    if (connection_->closed) return false;
    if (!room) {  // the client reads nothing: give up on it
      connection_->abort = true;
      lock.unlock();
      waker_->wake(connection_->id);
      return false;
    }
  }
  if (request_.minor_version == 1) return send(fmt::format("{:x}\r\n{}\r\n", data.size(), data), false);
  return send(std::string(data), false);
}

void Exchange::finish() {
  if (!streaming_ || finished_) return;
  finished_ = true;
  send(request_.minor_version == 1 ? "0\r\n\r\n" : "", true);
}

bool Exchange::client_gone() const {
  std::lock_guard lock(connection_->mutex);
  return connection_->closed;
}

}  // namespace kettle::server::http
