// `kettle bench serve --url URL`: a load test against a running server (kettle,
// or any OpenAI-compatible one). C clients send N streamed /v1/completions
// requests in all (each its own prompt of about P words, G tokens generated,
// end of sequence ignored); it reports time to first token, latency and the
// time between tokens (mean and percentiles) and the aggregate output tok/s,
// and records the run in the eval history.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/eval_history.h"
#include "server/http/upstream.h"
#include "util/error.h"

namespace kettle::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchServeFlags {
  std::string url = "http://127.0.0.1:8080";
  std::string model;  // empty: the server's first /v1/models entry
  std::string api_key;
  int clients = 8;
  int requests = 32;
  int prompt_words = 256;
  int max_tokens = 128;
  double timeout_seconds = 600;
  bool json = false;
  std::string evals_db;
  bool no_record = false;
};

struct Target {
  std::string host;
  int port = 80;
};

Target parse_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0)
    fail(ErrorCategory::kInvalidArgument, "bench serve: --url {}: only http://HOST:PORT is supported", url);
  std::string rest = url.substr(kScheme.size());
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    if (rest.substr(slash) != "/" && rest.substr(slash) != "/v1" && rest.substr(slash) != "/v1/")
      fail(ErrorCategory::kInvalidArgument, "bench serve: --url {}: give the server's address without a path", url);
    rest = rest.substr(0, slash);
  }
  Target t;
  const size_t colon = rest.rfind(':');
  const bool bracketed = !rest.empty() && rest.front() == '[';
  if (colon != std::string::npos && (!bracketed || rest[colon - 1] == ']')) {
    t.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    t.port = std::atoi(port.c_str());
    if (t.port <= 0 || t.port > 65535 || port.find_first_not_of("0123456789") != std::string::npos)
      fail(ErrorCategory::kInvalidArgument, "bench serve: --url {}: bad port '{}'", url, port);
  } else {
    t.host = rest;
  }
  if (bracketed) t.host = t.host.substr(1, t.host.size() - 2);
  if (t.host.empty()) fail(ErrorCategory::kInvalidArgument, "bench serve: --url {}: no host", url);
  return t;
}

struct Reply {
  int status = 0;
  std::string body;  // whole responses
};

std::string request_text(const BenchServeFlags& f, const std::string& method, const std::string& path,
                         const std::string& body) {
  std::string out = fmt::format("{} {} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n", method, path);
  if (!f.api_key.empty()) out += fmt::format("authorization: Bearer {}\r\n", f.api_key);
  if (!body.empty()) out += fmt::format("content-type: application/json\r\ncontent-length: {}\r\n", body.size());
  return out + "\r\n" + body;
}

Reply get(const BenchServeFlags& f, const Target& t, const std::string& path) {
  std::string why;
  auto up = server::http::Upstream::connect_tcp(t.host, t.port, why);
  if (!up) fail(ErrorCategory::kInvalidArgument, "bench serve: cannot connect to {} ({})", f.url, why);
  server::http::Response head;
  const auto late = [deadline = Clock::now() + std::chrono::seconds(30)] { return Clock::now() > deadline; };
  if (!up->send(request_text(f, "GET", path, "")) || !up->read_head(head, 30, late, false))
    fail(ErrorCategory::kInvalidArgument, "bench serve: {} did not answer GET {}", f.url, path);
  Reply r{head.status, ""};
  for (bool done = false; !done;) {
    std::string piece;
    if (!up->read_body(piece, done, late)) break;
    r.body += piece;
  }
  return r;
}

// About n words of text, distinct per request (so no two share a cached prefix past a word or two).
std::string prompt_text(int request, int n) {
  static const char* const kWords[] = {"the", "kettle", "sings", "while", "water", "warms", "and", "tea",
                                       "waits", "in", "its", "pot", "by", "a", "window", "morning"};
  std::string s = fmt::format("Request {}:", request);
  uint32_t x = static_cast<uint32_t>(request) * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    s += ' ';
    s += kWords[(x >> 16) % 16];
  }
  return s;
}

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, latency = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

// One streamed completion, timed.
Outcome run_request(const BenchServeFlags& f, const Target& t, const std::string& model, int index) {
  Outcome o;
  const nlohmann::json body = {{"model", model},      {"prompt", prompt_text(index, f.prompt_words)},
                               {"max_tokens", f.max_tokens}, {"temperature", 0},
                               {"stream", true},      {"stream_options", {{"include_usage", true}}},
                               {"ignore_eos", true}};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(f.timeout_seconds));
  const auto late = [deadline] { return Clock::now() > deadline; };
  const auto since = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::string why;
  auto up = server::http::Upstream::connect_tcp(t.host, t.port, why);
  server::http::Response head;
  if (!up || !up->send(request_text(f, "POST", "/v1/completions", body.dump())) ||
      !up->read_head(head, f.timeout_seconds, late, false)) {
    o.error = up ? "no response" : "cannot connect: " + why;
    return o;
  }
  std::string pending, piece;
  bool done = false, first = true;
  while (!done) {
    if (!up->read_body(piece, done, late)) {
      o.error = late() ? "timed out" : "the stream was cut";
      return o;
    }
    pending += piece;
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string event = pending.substr(0, end);
      if (event.rfind("data: {", 0) != 0) continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        o.error = j["error"].value("message", "an error event");
        return o;
      }
      const auto& choices = j.value("choices", nlohmann::json::array());
      if (first && !choices.empty() && !choices[0].value("text", "").empty()) {
        o.ttft = since();
        first = false;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        o.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        o.output_tokens = j["usage"].value("completion_tokens", 0);
      }
    }
  }
  if (head.status != 200) {
    o.error = fmt::format("HTTP {}: {}", head.status, pending.substr(0, 200));
    return o;
  }
  o.latency = since();
  o.ok = true;
  return o;
}

nlohmann::json distribution(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const auto at = [&v](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"mean", sum / static_cast<double>(v.size())}, {"p50", at(0.5)}, {"p90", at(0.9)}, {"p99", at(0.99)},
          {"max", v.back()}};
}

int run_bench_serve(const BenchServeFlags& f) {
  const Target target = parse_url(f.url);
  std::string model = f.model;
  if (model.empty()) {
    const Reply models = get(f, target, "/v1/models");
    const nlohmann::json j = nlohmann::json::parse(models.body, nullptr, false);
    if (models.status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty())
      fail(ErrorCategory::kInvalidArgument, "bench serve: GET {}/v1/models answered {}: {}", f.url, models.status,
           models.body.substr(0, 200));
    model = j["data"][0].value("id", "");
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(f.requests));
  std::atomic<int> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < std::min(f.clients, f.requests); ++c)
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < f.requests;) outcomes[static_cast<size_t>(i)] = run_request(f, target, model, i);
    });
  for (std::thread& t : clients) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, latency, between;
  int64_t output = 0, prompt = 0, ok = 0;
  std::string first_error;
  for (const Outcome& o : outcomes) {
    if (!o.ok) {
      if (first_error.empty()) first_error = o.error;
      continue;
    }
    ++ok;
    ttft.push_back(o.ttft);
    latency.push_back(o.latency);
    if (o.output_tokens > 1) between.push_back((o.latency - o.ttft) / static_cast<double>(o.output_tokens - 1));
    output += o.output_tokens;
    prompt += o.prompt_tokens;
  }
  const nlohmann::json results = {
      {"url", f.url},
      {"model", model},
      {"clients", f.clients},
      {"requests", f.requests},
      {"succeeded", ok},
      {"failed", f.requests - ok},
      {"first_error", first_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(first_error)},
      {"prompt_words", f.prompt_words},
      {"prompt_tokens_mean", ok > 0 ? static_cast<double>(prompt) / static_cast<double>(ok) : 0.0},
      {"max_tokens", f.max_tokens},
      {"wall_seconds", wall},
      {"output_tokens", output},
      {"output_tokens_per_second", static_cast<double>(output) / wall},
      {"requests_per_second", static_cast<double>(ok) / wall},
      {"ttft_seconds", distribution(ttft)},
      {"latency_seconds", distribution(latency)},
      {"inter_token_seconds", distribution(between)}};
  if (f.json) {
    std::printf("%s\n", results.dump().c_str());
  } else {
    std::printf("| server | model | clients | requests (ok) | prompt tok | out tok/s | TTFT p50 / p99 ms | latency p50 / p99 s | "
                "between tokens p50 ms |\n|---|---|---|---|---|---|---|---|---|\n");
    const auto ms = [](const nlohmann::json& d, const char* k) { return d.is_null() ? 0.0 : 1000.0 * d[k].get<double>(); };
    const auto s = [](const nlohmann::json& d, const char* k) { return d.is_null() ? 0.0 : d[k].get<double>(); };
    std::printf("| %s | %s | %d | %d (%lld) | %.0f | %.1f | %.0f / %.0f | %.2f / %.2f | %.1f |\n", f.url.c_str(),
                model.c_str(), f.clients, f.requests, static_cast<long long>(ok), results["prompt_tokens_mean"].get<double>(),
                results["output_tokens_per_second"].get<double>(), ms(results["ttft_seconds"], "p50"),
                ms(results["ttft_seconds"], "p99"), s(results["latency_seconds"], "p50"),
                s(results["latency_seconds"], "p99"), ms(results["inter_token_seconds"], "p50"));
    if (!first_error.empty()) std::printf("%lld request(s) failed; the first: %s\n", static_cast<long long>(f.requests - ok),
                                          first_error.c_str());
    std::fflush(stdout);
  }
  if (!f.no_record) record_bench_run(f.evals_db, "bench serve", model, f.url, results);
  return ok == f.requests ? 0 : 1;
}

}  // namespace

Action register_bench_serve(CLI::App& app) {
  auto f = std::make_shared<BenchServeFlags>();
  app.add_option("--url", f->url, "the server (http://HOST:PORT)")->capture_default_str();
  app.add_option("--model", f->model, "the request's model field (default: the server's first /v1/models entry)");
  app.add_option("--api-key", f->api_key, "sent as Authorization: Bearer KEY")->envname("KETTLE_API_KEY");
  app.add_option("-c,--clients", f->clients, "requests in flight at once")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("-n,--requests", f->requests, "requests in all")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("-p,--prompt-words", f->prompt_words, "words of each prompt (distinct per request)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-g,--max-tokens", f->max_tokens, "tokens each request generates (end of sequence ignored)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--timeout", f->timeout_seconds, "seconds a request may take before it counts as failed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", f->json, "print one JSON object instead of the table");
  app.add_option("--evals-db", f->evals_db, "record the run in this eval history database");
  app.add_flag("--no-record", f->no_record, "do not record the run in the eval history");
  return [f] { return run_bench_serve(*f); };
}

}  // namespace kettle::cli
