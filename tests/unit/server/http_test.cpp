// The HTTP layer's pure parts: RequestParser on framing a hostile client
// chooses (checked against RFC 9112's rules), and AccessPolicy's decisions
// (Host, Origin, keys, admin from another machine), which the e2e tests can
// reach only from loopback.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "server/access_policy.h"
#include "server/http/request_parser.h"

namespace kettle::server {
namespace {

using http::ParseLimits;
using http::RequestParser;
using Status = RequestParser::Status;

struct Parsed {
  Status status;
  int error = 0;
  http::Request request;
  std::string rest;
};

// Feeds `bytes` one byte at a time (the worst cut) and again whole; both must agree.
Parsed parse(const std::string& bytes, ParseLimits limits = {}) {
  RequestParser whole(limits);
  std::string in = bytes;
  Parsed a{whole.feed(in), whole.error_status(), whole.request(), in};
  RequestParser bytewise(limits);
  std::string trickle;
  Status s = Status::kNeedMore;
  for (char c : bytes) {
    trickle += c;
    s = bytewise.feed(trickle);
    if (s != Status::kNeedMore) break;
  }
  EXPECT_EQ(s, a.status) << bytes;
  EXPECT_EQ(bytewise.error_status(), a.error) << bytes;
  if (s == Status::kComplete) {
    EXPECT_EQ(bytewise.request().body, a.request.body);
  }
  return a;
}

TEST(RequestParser, ContentLengthBodyAndAPipelinedRequestLeftOver) {
  Parsed p = parse("POST /v1/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n");
  ASSERT_EQ(p.status, Status::kComplete);
  EXPECT_EQ(p.request.method, "POST");
  EXPECT_EQ(p.request.path, "/v1/x");
  EXPECT_EQ(p.request.query, "y=1");
  EXPECT_EQ(p.request.body, "hello");
  EXPECT_EQ(p.rest, "GET / HTTP/1.1\r\n");
}

TEST(RequestParser, ChunkedBodyWithExtensionsAndTrailers) {
  Parsed p = parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n0\r\nT: v\r\n\r\n");
  ASSERT_EQ(p.status, Status::kComplete);
  EXPECT_EQ(p.request.body, "abc0123456789");
}

TEST(RequestParser, BodiesPastTheLimitAre413WhateverTheFraming) {
  ParseLimits small{1024, 8, 10};
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", small).error, 413);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n6\r\n", small).error, 413);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n", small).error, 413);
}

TEST(RequestParser, HeadLimits) {
  ParseLimits small{64, 2, 10};
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n", small).error, 431);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: " + std::string(100, 'a'), small).error, 431);
}

TEST(RequestParser, AmbiguousFramingIsRefused) {
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n").error, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").error, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n").error, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").error, 501);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n").error, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\n\r\n").error, 400);  // 1.1 needs Host
  EXPECT_EQ(parse("GET / HTTP/2.0\r\n\r\n").error, 505);
  EXPECT_EQ(parse("GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n").error, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n").error, 400);
}

TEST(RequestParser, PercentDecodedPathMayHoldAnyByte) {
  Parsed p = parse("GET /%ff%41 HTTP/1.0\r\n\r\n");
  ASSERT_EQ(p.status, Status::kComplete);
  EXPECT_EQ(p.request.path, "/\xff" "A");
  EXPECT_FALSE(p.request.wants_keep_alive());
}

http::Request request(std::string host, std::string origin = "", bool loopback = true) {
  http::Request r;
  r.headers.push_back({"host", std::move(host)});
  if (!origin.empty()) r.headers.push_back({"origin", std::move(origin)});
  r.peer_loopback = loopback;
  return r;
}

int status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e.status();
  }
  return 0;
}

TEST(AccessPolicy, HostMustNameTheServer) {
  AccessPolicy loopback({{}, {}, {}, "127.0.0.1"});
  EXPECT_EQ(status_of([&] { loopback.check_site(request("localhost:8080")); }), 0);
  EXPECT_EQ(status_of([&] { loopback.check_site(request("127.0.0.1")); }), 0);
  EXPECT_EQ(status_of([&] { loopback.check_site(request("evil.example:8080")); }), 403);
  AccessPolicy named({{}, {}, {"kettle.lan"}, "127.0.0.1"});
  EXPECT_EQ(status_of([&] { named.check_site(request("KETTLE.lan:80")); }), 0);
  AccessPolicy any({{}, {}, {}, "0.0.0.0"});
  EXPECT_EQ(status_of([&] { any.check_site(request("box.example")); }), 0);
  EXPECT_TRUE(any.exposed());
  EXPECT_FALSE(loopback.exposed());
}

TEST(AccessPolicy, OriginsAndTheirCorsHeaders) {
  AccessPolicy policy({{}, {"https://app.example"}, {}, "127.0.0.1"});
  EXPECT_EQ(status_of([&] { policy.check_site(request("localhost:8080", "http://localhost:8080")); }), 0);
  EXPECT_EQ(status_of([&] { policy.check_site(request("localhost:8080", "https://app.example")); }), 0);
  EXPECT_EQ(status_of([&] { policy.check_site(request("localhost:8080", "http://evil.example")); }), 403);
  EXPECT_EQ(status_of([&] { policy.check_site(request("localhost:8080", "null")); }), 403);
  auto cors = policy.cors_headers(request("localhost:8080", "https://app.example"));
  ASSERT_FALSE(cors.empty());
  EXPECT_EQ(cors[0].value, "https://app.example");
}

TEST(AccessPolicy, KeysAndAdmin) {
  AccessPolicy open({{}, {}, {}, "0.0.0.0"});
  EXPECT_EQ(open.authenticate(request("a")), 0);
  EXPECT_EQ(status_of([&] { open.check_admin(request("a", "", false)); }), 403);
  EXPECT_EQ(status_of([&] { open.check_admin(request("a", "", true)); }), 0);
  AccessPolicy keyed({{"first-key-1", "second-key-2"}, {}, {}, "0.0.0.0"});
  http::Request r = request("a", "", false);
  EXPECT_EQ(status_of([&] { keyed.authenticate(r); }), 401);
  r.headers.push_back({"authorization", "Bearer second-key-2"});
  EXPECT_EQ(keyed.authenticate(r), 1);
  EXPECT_EQ(status_of([&] { keyed.check_admin(r); }), 0);
  http::Request x = request("a");
  x.headers.push_back({"x-api-key", "first-key-"});
  EXPECT_EQ(status_of([&] { keyed.authenticate(x); }), 401);
  x.headers.back().value = "first-key-1";
  EXPECT_EQ(keyed.authenticate(x), 0);
}

}  // namespace
}  // namespace kettle::server
