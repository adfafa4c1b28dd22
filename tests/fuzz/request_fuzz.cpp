// libFuzzer target: every byte string a client could send as the body of
// /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses or /v1/embeddings goes
// through the same
// parsers the server runs; a reply is either CompletionParams or an ApiError
// (any other exception, a crash or a sanitizer report is a finding). Text that
// parses also runs through the reasoning / tool-call output parser, split at
// a data-dependent point, as streamed model output would be. The same bytes
// also arrive as an HTTP request, in pieces cut at data-dependent points: the
// framing parser must end in a request within its limits or a 4xx/5xx status
// it knows, and read the same request however the bytes were cut. A request
// that asks for structured output has its constraint compiled to a grammar.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/output_parser.h"
#include "grammar/grammar.h"
#include "server/anthropic_protocol.h"
#include "server/embeddings_protocol.h"
#include "server/http/request_parser.h"
#include "server/openai_protocol.h"
#include "server/output_constraint.h"
#include "server/request_fields.h"
#include "server/request_schema.h"
#include "server/responses_protocol.h"
#include "util/error.h"

namespace {

// A request's output constraint compiles to GBNF and then to a grammar, or is refused with an Error.
void compile_constraint(const kettle::server::CompletionParams& p, bool reasoning) {
  using namespace kettle;
  if (p.constraint.kind == server::OutputConstraint::Kind::kNone) return;
  OutputParserOptions shape;
  shape.format.tool_calls = ToolCallFormat::kHermes;
  shape.format.reasoning = reasoning;
  try {
    const std::string gbnf = server::constraint_gbnf(p.constraint, shape, p.tools);
    grammar::parse_gbnf(gbnf, server::kConstraintRoot);
  } catch (const Error&) {
  }
}

void parse_request(const std::string& body) {
  using namespace kettle::server;
  RequestContext ctx{"kettle-demo", 4096, {}};
  try {
    nlohmann::ordered_json json = parse_body(body);
    static ResponseStore store(1 << 20, std::chrono::seconds(3600));
    for (int api = 0; api < 5; ++api) {
      try {
        if (api == 4) {  // /v1/embeddings: the field table, the inputs, a response of their sizes
          check_fields(json, Route::kEmbeddings);
          const EmbeddingsParams e = parse_embeddings_request(json, 4096);
          if (e.count() == 0 || e.count() > kMaxEmbeddingInputs) __builtin_trap();
          embeddings_response("m", std::vector<std::vector<float>>(e.count(), std::vector<float>(3, 0.5f)), e.base64, 1);
          continue;
        }
        if (api == 3) {  // /v1/responses: its parser (with a store to look up), its writer
          ResponsesRequest r = parse_responses_request(json, ctx, store);
          auto writer = make_responses_writer({"resp_x", 0, "m"}, std::move(r), nullptr);
          writer->stream_start(1);
          writer->stream_finish(TurnEnd{"stop", "", 1, 1, 0});
          continue;
        }
        CompletionParams p = api == 2 ? parse_anthropic_request(json, ctx) : parse_openai_request(json, api == 0, ctx);
        auto format = api == 2 ? make_anthropic_writer("msg_x", "m") : make_openai_writer({"id", 0, "m"}, p);
        format->stream_start(1);
        compile_constraint(p, api == 1);
      } catch (const ApiError& e) {
        if (e.status() != 400 && e.status() != 404) __builtin_trap();  // a parser answers 400 or 404 only
      }
    }
  } catch (const ApiError&) {
  }
}

void parse_output(const std::string& text) {
  using namespace kettle;
  if (text.empty()) return;
  const auto flags = static_cast<unsigned char>(text[0]);
  OutputParserOptions options;
  options.format.tool_calls = static_cast<ToolCallFormat>(flags % 3);
  options.format.reasoning = (flags & 4) != 0;
  options.tools_requested = (flags & 8) != 0;
  options.starts_in_reasoning = options.format.reasoning && (flags & 16) != 0;
  OutputParser parser(options);
  const std::string_view output = std::string_view(text).substr(1);
  const size_t split = text.size() > 1 ? static_cast<unsigned char>(text[1]) % (output.size() + 1) : 0;
  parser.push(output.substr(0, split));
  parser.push(output.substr(split));
  parser.finish();
}

// Parses `bytes` as one HTTP request fed in the given pieces; returns a fingerprint of the outcome.
std::string parse_http(const std::string& bytes, size_t cut_a, size_t cut_b) {
  using namespace kettle::server::http;
  static const ParseLimits limits{4096, 16, 16384};
  RequestParser parser(limits);
  std::string in;
  RequestParser::Status status = RequestParser::Status::kNeedMore;
  const size_t cuts[] = {std::min(cut_a, cut_b), std::max(cut_a, cut_b), bytes.size()};
  size_t from = 0;
  for (size_t cut : cuts) {
    in.append(bytes, from, cut - from);
    from = cut;
    status = parser.feed(in);
    if (status != RequestParser::Status::kNeedMore) break;
  }
  if (status == RequestParser::Status::kError) {
    const int s = parser.error_status();
    if (s != 400 && s != 413 && s != 417 && s != 431 && s != 501 && s != 505) __builtin_trap();
    return "error " + std::to_string(s);
  }
  in.append(bytes, from, std::string::npos);  // bytes not fed yet belong to what comes next
  if (status == RequestParser::Status::kNeedMore) return "more";
  const Request& r = parser.request();
  if (r.body.size() > limits.max_body_bytes || r.headers.size() > limits.max_headers) __builtin_trap();
  return r.method + ' ' + r.path + ' ' + std::to_string(r.headers.size()) + ' ' + r.body + " rest " + in;
}

void check_http(const std::string& bytes) {
  if (bytes.size() < 2) return;
  const std::string body = bytes.substr(2);
  const size_t a = static_cast<unsigned char>(bytes[0]) % (body.size() + 1);
  const size_t b = static_cast<unsigned char>(bytes[1]) * 7 % (body.size() + 1);
  if (parse_http(body, a, b) != parse_http(body, body.size(), body.size())) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  parse_request(input);
  parse_output(input);
  check_http(input);
  return 0;
}
