// The request parsers and response writers of both APIs, without a socket:
// each malformed field is a 400 naming it; Anthropic content blocks become
// the messages chat templates expect; the writers produce the documented
// shapes (block indices, tool-call indices, stop reasons).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "server/anthropic_protocol.h"
#include "server/embeddings_protocol.h"
#include "server/openai_protocol.h"
#include "server/request_fields.h"
#include "server/request_schema.h"
#include "server/response_store.h"
#include "server/responses_protocol.h"

namespace kettle::server {
namespace {

using ojson = nlohmann::ordered_json;

const RequestContext kCtx{"demo", 100, {}};

ojson chat_body(ojson extra = ojson::object()) {
  ojson body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// The param an OpenAI request is rejected for (status 400 expected), or "" when accepted.
std::string rejected_param(const ojson& body, bool chat = true) {
  try {
    parse_openai_request(body, chat, kCtx);
    return "";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    return e.param();
  }
}

TEST(OpenAiRequest, EachBadFieldIsNamed) {
  EXPECT_EQ(rejected_param(chat_body({{"temperature", "hot"}})), "temperature");
  EXPECT_EQ(rejected_param(chat_body({{"temperature", 3}})), "temperature");
  EXPECT_EQ(rejected_param(chat_body({{"top_p", -0.5}})), "top_p");
  EXPECT_EQ(rejected_param(chat_body({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(rejected_param(chat_body({{"max_tokens", 1.5}})), "max_tokens");
  EXPECT_EQ(rejected_param(chat_body({{"n", 2}})), "n");
  EXPECT_EQ(rejected_param(chat_body({{"stop", {"a", "b", "c", "d", "e"}}})), "stop");
  EXPECT_EQ(rejected_param(chat_body({{"presence_penalty", 2.5}})), "presence_penalty");
  EXPECT_EQ(rejected_param(chat_body({{"logit_bias", {{"100", 1}}}})), "logit_bias");  // vocab is 100
  EXPECT_EQ(rejected_param(chat_body({{"logit_bias", {{"x", 1}}}})), "logit_bias");
  EXPECT_EQ(rejected_param(chat_body({{"logit_bias", {{"5", 101}}}})), "logit_bias.5");
  EXPECT_EQ(rejected_param(chat_body({{"top_logprobs", 3}})), "top_logprobs");  // without logprobs: true
  EXPECT_EQ(rejected_param(chat_body({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  EXPECT_EQ(rejected_param(chat_body({{"tools", {{{"type", "function"}}}}})), "tools[0]");
  // A field of the wrong JSON type is named, not thrown past the parser (found by the fuzz pass).
  EXPECT_EQ(rejected_param(chat_body({{"tools", {{{"type", {{"name", "f"}}}}}}})), "tools[0]");
  EXPECT_EQ(rejected_param(chat_body({{"tool_choice", "sometimes"}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}})),
            "tool_choice");
  EXPECT_EQ(rejected_param({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}),
            "messages[0].content[0]");
  EXPECT_EQ(rejected_param({{"messages", ojson::array()}}), "messages");
  EXPECT_EQ(rejected_param({{"prompt", 5}}, false), "prompt");
  EXPECT_EQ(rejected_param({{"prompt", "x"}, {"logprobs", 6}}, false), "logprobs");
  EXPECT_EQ(rejected_param(chat_body({{"max_tokens", 5}, {"user", "someone"}})), "");
}

// One model is served: any name routes to it; a name that is not a string is refused by name.
TEST(OpenAiRequest, AnyModelNameRoutesToTheServedModel) {
  EXPECT_NO_THROW(parse_openai_request(chat_body({{"model", "gpt-4"}}), true, kCtx));
  EXPECT_NO_THROW(parse_openai_request(chat_body({{"model", "default"}}), true, kCtx));
  EXPECT_EQ(rejected_param(chat_body({{"model", 4}})), "model");
}

TEST(OpenAiRequest, ToolCallArgumentsReachTheTemplateAsObjects) {
  ojson body = {{"messages",
                 {{{"role", "assistant"},
                   {"content", nullptr},
                   {"tool_calls",
                    {{{"id", "call_1"}, {"type", "function"},
                      {"function", {{"name", "f"}, {"arguments", R"({"b": 1, "a": [2]})"}}}}}}},
                  {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "ok"}}}},
                {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  CompletionParams p = parse_openai_request(body, true, kCtx);
  const ojson& args = p.messages[0]["tool_calls"][0]["function"]["arguments"];
  ASSERT_TRUE(args.is_object());
  EXPECT_EQ(args.dump(), R"({"b":1,"a":[2]})");  // the client's key order is kept
  EXPECT_EQ(p.messages[0]["content"], "");
  EXPECT_EQ(p.messages[1]["tool_call_id"], "call_1");
  EXPECT_TRUE(p.tools.is_array());
  body["tool_choice"] = "none";
  EXPECT_TRUE(parse_openai_request(body, true, kCtx).tools.is_null());
}

TEST(OpenAiRequest, SamplingFieldsLandInSamplingParams) {
  CompletionParams p = parse_openai_request(
      chat_body({{"temperature", 0.7}, {"top_k", 5}, {"seed", 42}, {"repetition_penalty", 1.3},
                 {"frequency_penalty", -1}, {"logit_bias", {{"7", -100}}}, {"logprobs", true}, {"top_logprobs", 4},
                 {"chat_template_kwargs", {{"enable_thinking", false}}}}),
      true, kCtx);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.7f);
  EXPECT_EQ(p.sampling.top_k, 5);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -1.0f);
  ASSERT_EQ(p.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(p.sampling.logit_bias[0].first, 7);
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 4);
  EXPECT_EQ(p.thinking, std::optional<bool>(false));
}

ojson anthropic_body(ojson messages) {
  return {{"model", "demo"}, {"max_tokens", 10}, {"messages", std::move(messages)}};
}

TEST(AnthropicRequest, BlocksBecomeTemplateMessages) {
  ojson body = anthropic_body(
      {{{"role", "user"}, {"content", "weather?"}},
       {{"role", "assistant"},
        {"content",
         {{{"type", "thinking"}, {"thinking", "look it up"}, {"signature", ""}},
          {{"type", "text"}, {"text", "Checking."}},
          {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get"}, {"input", {{"city", "Paris"}}}}}}},
       {{"role", "user"},
        {"content",
         {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", {{{"type", "text"}, {"text", "18 C"}}}}},
          {{"type", "text"}, {"text", "thanks"}}}}}});
  body["system"] = {{{"type", "text"}, {"text", "Be brief."}}};
  body["tools"] = {{{"name", "get"}, {"description", "weather"}, {"input_schema", {{"type", "object"}}}}};
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  CompletionParams p = parse_anthropic_request(body, kCtx);
  ASSERT_EQ(p.messages.size(), 5u);
  EXPECT_EQ(p.messages[0], ojson({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(p.messages[2]["content"], "Checking.");
  EXPECT_EQ(p.messages[2]["reasoning_content"], "look it up");
  EXPECT_EQ(p.messages[2]["tool_calls"][0]["function"]["arguments"], ojson({{"city", "Paris"}}));
  EXPECT_EQ(p.messages[3], ojson({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "18 C"}}));
  EXPECT_EQ(p.messages[4], ojson({{"role", "user"}, {"content", "thanks"}}));
  EXPECT_EQ(p.tools[0]["function"]["parameters"], ojson({{"type", "object"}}));
  EXPECT_EQ(p.thinking, std::optional<bool>(true));
  EXPECT_EQ(p.max_tokens, std::optional<int64_t>(10));
}

TEST(AnthropicRequest, RequiredFieldsAndBadBlocksAreNamed) {
  auto param = [](const ojson& body) {
    try {
      parse_anthropic_request(body, kCtx);
      return std::string();
    } catch (const ApiError& e) {
      return e.param();
    }
  };
  ojson ok = anthropic_body({{{"role", "user"}, {"content", "hi"}}});
  ojson b = ok;
  b.erase("max_tokens");
  EXPECT_EQ(param(b), "max_tokens");
  b = ok;
  b.erase("model");
  EXPECT_EQ(param(b), "model");
  EXPECT_EQ(param(anthropic_body({{{"role", "system"}, {"content", "x"}}})), "messages[0].role");
  EXPECT_EQ(param(anthropic_body({{{"role", "user"}, {"content", {{{"type", "image"}}}}}})), "messages[0].content[0]");
  EXPECT_EQ(param(anthropic_body({{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "x"}}}}}})),
            "messages[0].content[0]");  // tool_use belongs to the assistant
  EXPECT_EQ(param(anthropic_body({{{"role", "user"},
                                   {"content",
                                    {{{"type", "tool_result"},
                                      {"tool_use_id", "t"},
                                      {"content", {{{"type", {{"x", 1}}}, {"text", "r"}}}}}}}}})),
            "messages[0].content[0].content[0]");  // a block type that is not a string
  b = ok;
  b["temperature"] = 1.5;  // Anthropic's range is [0, 1]
  EXPECT_EQ(param(b), "temperature");
  b = ok;
  b["thinking"] = {{"type", "sometimes"}};
  EXPECT_EQ(param(b), "thinking.type");
  EXPECT_EQ(param(ok), "");
}

// Splits a stream of `event: X\ndata: {...}\n\n` into (X, data).
std::vector<std::pair<std::string, ojson>> events(const std::string& sse) {
  std::vector<std::pair<std::string, ojson>> out;
  size_t at = 0;
  while (at < sse.size()) {
    size_t end = sse.find("\n\n", at);
    std::string block = sse.substr(at, end - at);
    size_t nl = block.find('\n');
    out.emplace_back(block.substr(7, nl - 7), ojson::parse(block.substr(nl + 7)));
    at = end + 2;
  }
  return out;
}

TEST(AnthropicStream, OneBlockPerKindInOrderWithStopReason) {
  auto format = make_anthropic_writer("msg_1", "demo");
  std::string sse = format->stream_start(7);
  TurnDelta d1;
  d1.reasoning = "hmm";
  sse += format->stream_delta(d1);
  TurnDelta d2;
  d2.reasoning = " more";
  d2.content = "Answer";
  sse += format->stream_delta(d2);
  TurnDelta d3;
  d3.tool_calls.push_back({"toolu_a", "get", R"({"city":"Paris"})"});
  sse += format->stream_delta(d3);
  sse += format->stream_finish({"tool_calls", "", 7, 12});
  std::vector<std::string> names;
  for (auto& [name, data] : events(sse)) {
    EXPECT_EQ(data["type"], name);
    names.push_back(name);
  }
  const std::vector<std::string> expected = {
      "message_start",       "ping",                "content_block_start", "content_block_delta", "content_block_delta",
      "content_block_stop",  "content_block_start", "content_block_delta", "content_block_stop",  "content_block_start",
      "content_block_delta", "content_block_stop",  "message_delta",       "message_stop"};
  EXPECT_EQ(names, expected);
  auto ev = events(sse);
  EXPECT_EQ(ev[2].second["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[6].second["index"], 1);
  EXPECT_EQ(ev[9].second["content_block"]["type"], "tool_use");
  EXPECT_EQ(ev[10].second["delta"]["partial_json"], R"({"city":"Paris"})");
  EXPECT_EQ(ev[12].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[12].second["usage"]["output_tokens"], 12);
}

TEST(AnthropicStream, StopReasons) {
  auto reason = [](TurnEnd end) {
    auto format = make_anthropic_writer("m", "demo");
    return ojson::parse(format->full_response(Turn{}, end))["stop_reason"].get<std::string>();
  };
  EXPECT_EQ(reason({"stop", "", 1, 1}), "end_turn");
  EXPECT_EQ(reason({"length", "", 1, 1}), "max_tokens");
  EXPECT_EQ(reason({"stop", "END", 1, 1}), "stop_sequence");
  EXPECT_EQ(reason({"tool_calls", "", 1, 1}), "tool_use");
}

TEST(OpenAiStream, ToolCallsAreIndexedAndReasoningIsItsOwnDelta) {
  CompletionParams params;
  params.chat = true;
  auto format = make_openai_writer({"chatcmpl-1", 0, "demo"}, params);
  TurnDelta d;
  d.reasoning = "think";
  d.tool_calls = {{"call_a", "f", "{}"}, {"call_b", "g", R"({"x":1})"}};
  std::string sse = format->stream_delta(d);
  std::vector<ojson> chunks;
  for (size_t at = 0; at < sse.size();) {
    size_t end = sse.find("\n\n", at);
    chunks.push_back(ojson::parse(sse.substr(at + 6, end - at - 6)));
    at = end + 2;
  }
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], R"({"x":1})");
  ojson whole = ojson::parse(format->full_response(Turn{"r", "", d.tool_calls, {}}, {"tool_calls", "", 3, 4}));
  EXPECT_TRUE(whole["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(whole["usage"]["total_tokens"], 7);
}

}  // namespace
}  // namespace kettle::server

namespace kettle::server {
namespace {

// Every field of every route's table (request_schema.cpp), each with a valid value: an
// applied or informational field is taken, a refused one is a 400 naming it; a field in
// no table is refused as unknown. A field added to a table without a sample here fails.
TEST(RequestFields, EveryFieldOfEveryRouteIsAppliedOrRefusedByName) {
  // Sampling fields and identifiers, as the OpenAI-shaped routes share them.
  std::map<std::string, ojson> sampling_samples = {
      {"model", {{"model", "gpt-4o"}}},
      {"temperature", {{"temperature", 0.5}}},
      {"top_p", {{"top_p", 0.9}}},
      {"top_k", {{"top_k", 5}}},
      {"min_p", {{"min_p", 0.1}}},
      {"seed", {{"seed", 1}}},
      {"presence_penalty", {{"presence_penalty", 0.1}}},
      {"frequency_penalty", {{"frequency_penalty", 0.1}}},
      {"repetition_penalty", {{"repetition_penalty", 1.1}}},
      {"cache_salt", {{"cache_salt", "salt"}}},
      {"user", {{"user", "u"}}},
      {"safety_identifier", {{"safety_identifier", "u"}}},
      {"prompt_cache_key", {{"prompt_cache_key", "k"}}},
      {"metadata", {{"metadata", {{"k", "v"}}}}},
      {"service_tier", {{"service_tier", "auto"}}},
      {"stream", {{"stream", false}}},
      {"parallel_tool_calls", {{"parallel_tool_calls", true}}},
      {"tool_choice", {{"tool_choice", "auto"}}},
  };
  std::map<std::string, ojson> openai_samples = sampling_samples;
  openai_samples.insert({
      {"max_tokens", {{"max_tokens", 5}}},
      {"max_completion_tokens", {{"max_completion_tokens", 5}}},
      {"n", {{"n", 1}}},
      {"logit_bias", {{"logit_bias", {{"5", 1}}}}},
      {"logprobs", {{"logprobs", true}}},
      {"repetition_context_size", {{"repetition_context_size", 20}}},
      {"xtc_probability", {{"xtc_probability", 0.5}}},
      {"response_format", ojson::parse(R"({"response_format": {"type": "json_object"}})")},
      {"guided_json", ojson::parse(R"({"guided_json": {"type": "object"}})")},
      {"guided_choice", ojson::parse(R"({"guided_choice": ["a", "b"]})")},
      {"guided_regex", ojson::parse(R"({"guided_regex": "[a-z]+"})")},
      {"guided_grammar", ojson::parse(R"({"guided_grammar": "root ::= [a]"})")},
      {"json_schema", ojson::parse(R"({"json_schema": {"type": "integer"}})")},
      {"grammar", ojson::parse(R"({"grammar": "root ::= [a]"})")},
      {"guided_decoding_backend", ojson::parse(R"({"guided_decoding_backend": "xgrammar"})")},
      {"xtc_threshold", {{"xtc_threshold", 0.1}}},
      {"presence_context_size", {{"presence_context_size", 20}}},
      {"frequency_context_size", {{"frequency_context_size", 20}}},
      {"stop", {{"stop", "x"}}},
      {"stream_options", {{"stream_options", {{"include_usage", true}}}}},
      {"ignore_eos", {{"ignore_eos", false}}},
      {"messages", ojson::object()},
      {"tools", {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}},
      {"top_logprobs", {{"logprobs", true}, {"top_logprobs", 2}}},
      {"chat_template_kwargs", {{"chat_template_kwargs", {{"enable_thinking", true}}}}},
      {"reasoning_effort", {{"reasoning_effort", "low"}}},
      {"response_format", {{"response_format", {{"type", "text"}}}}},
      {"store", {{"store", false}}},
      {"modalities", {{"modalities", {"text"}}}},
      {"prompt", ojson::object()},
  });
  const std::map<std::string, ojson> anthropic_samples = {
      {"model", ojson::object()},
      {"max_tokens", ojson::object()},
      {"messages", ojson::object()},
      {"system", {{"system", "be brief"}}},
      {"tools", {{"tools", {{{"name", "f"}, {"input_schema", ojson::object()}}}}}},
      {"tool_choice", {{"tool_choice", {{"type", "auto"}}}}},
      {"temperature", {{"temperature", 0.5}}},
      {"top_p", {{"top_p", 0.9}}},
      {"top_k", {{"top_k", 5}}},
      {"stop_sequences", {{"stop_sequences", {"x"}}}},
      {"stream", {{"stream", false}}},
      {"thinking", {{"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}}},
      {"cache_salt", {{"cache_salt", "salt"}}},
      {"metadata", {{"metadata", {{"user_id", "u"}}}}},
      {"service_tier", {{"service_tier", "auto"}}},
  };
  std::map<std::string, ojson> responses_samples = sampling_samples;
  responses_samples.insert({
      {"input", ojson::object()},
      {"instructions", {{"instructions", "be brief"}}},
      {"previous_response_id", {{"previous_response_id", "resp_stored"}}},
      {"store", {{"store", false}}},
      {"tools", {{"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", ojson::object()}}}}}},
      {"max_output_tokens", {{"max_output_tokens", 5}}},
      {"reasoning", {{"reasoning", {{"effort", "low"}}}}},
      {"text", {{"text", {{"format", {{"type", "text"}}}}}}},
      {"truncation", {{"truncation", "disabled"}}},
  });
  const std::map<std::string, ojson> embeddings_samples = {
      {"input", ojson::object()},
      {"model", {{"model", "text-embedding-3-small"}}},
      {"encoding_format", {{"encoding_format", "base64"}}},
      {"dimensions", {{"dimensions", 32}}},
      {"prompt_name", {{"prompt_name", "query"}}},
      {"user", {{"user", "u"}}},
  };
  ResponseStore store(1 << 20, std::chrono::seconds(3600));
  store.put("resp_stored", {ojson::object(), ojson::array({{{"role", "user"}, {"content", "hi"}}})});
  const auto param = [&](Route route, const ojson& body) {
    try {
      if (route == Route::kEmbeddings) {
        check_fields(body, route);
        parse_embeddings_request(body, 4096);
      } else if (route == Route::kResponses)
        parse_responses_request(body, kCtx, store);
      else if (route == Route::kAnthropicMessages)
        parse_anthropic_request(body, kCtx);
      else
        parse_openai_request(body, route == Route::kChatCompletions, kCtx);
      return std::string();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << e.what();
      return e.param();
    }
  };
  for (Route route : {Route::kChatCompletions, Route::kCompletions, Route::kAnthropicMessages, Route::kResponses,
                      Route::kEmbeddings}) {
    const bool anthropic = route == Route::kAnthropicMessages;
    const ojson base = anthropic ? ojson{{"model", "m"}, {"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
                       : route == Route::kChatCompletions ? chat_body()
                       : route == Route::kResponses       ? ojson{{"input", "hi"}}
                       : route == Route::kEmbeddings      ? ojson{{"input", {"hi", "there"}}}
                                                          : ojson{{"prompt", "hi"}};
    const auto& samples = anthropic                     ? anthropic_samples
                          : route == Route::kResponses  ? responses_samples
                          : route == Route::kEmbeddings ? embeddings_samples
                                                        : openai_samples;
    int applied = 0, refused = 0;
    for (const FieldRule& rule : field_rules(route)) {
      const std::string name(rule.name);
      ojson body = base;
      if (rule.use == FieldUse::kRefused) {
        body[name] = 7;  // no refused field's neutral value
        EXPECT_EQ(param(route, body), name) << "refused field accepted";
        ++refused;
        continue;
      }
      const auto sample = samples.find(name);
      ASSERT_NE(sample, samples.end()) << "no sample value for '" << name << "': add one to this test";
      for (const auto& [k, v] : sample->second.items()) body[k] = v;
      if (route == Route::kCompletions && body.contains("logprobs")) body["logprobs"] = 2;  // a count there
      EXPECT_EQ(param(route, body), "") << "applied field '" << name << "' refused";
      ++applied;
    }
    EXPECT_GT(applied, route == Route::kEmbeddings ? 4 : 10);
    EXPECT_GT(refused, route == Route::kEmbeddings ? 1 : 2);
    // A refused field's neutral value asks for what kettle does anyway: taken.
    for (const FieldRule& rule : field_rules(route)) {
      if (rule.use != FieldUse::kRefused || rule.neutral.empty()) continue;
      ojson body = base;
      body[std::string(rule.name)] = ojson::parse(rule.neutral);
      EXPECT_EQ(param(route, body), "") << "neutral " << rule.name << " = " << rule.neutral << " refused";
    }
    ojson unknown = base;
    unknown["frobnicate"] = true;
    EXPECT_EQ(param(route, unknown), "frobnicate");
    unknown["frobnicate"] = nullptr;  // null is absent
    EXPECT_EQ(param(route, unknown), "");
  }
}

TEST(OpenAiRequest, CompletionsTakeLogprobsAsACountOrTrue) {
  const auto parsed = [](ojson logprobs) {
    return parse_openai_request({{"prompt", "x"}, {"logprobs", std::move(logprobs)}}, false, kCtx).sampling;
  };
  EXPECT_TRUE(parsed(true).logprobs);
  EXPECT_EQ(parsed(true).top_logprobs, 0);
  EXPECT_FALSE(parsed(false).logprobs);
  EXPECT_TRUE(parsed(3).logprobs);
  EXPECT_EQ(parsed(3).top_logprobs, 3);
  EXPECT_EQ(rejected_param({{"prompt", "x"}, {"logprobs", "yes"}}, false), "logprobs");
}

TEST(RequestFields, ValuesKettleCannotApplyAreRefusedByName) {
  const ojson tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  const auto chat_param = [](const ojson& extra) { return rejected_param(chat_body(extra)); };
  EXPECT_EQ(chat_param({{"tools", tools}, {"tool_choice", "none"}}), "");
  EXPECT_EQ(chat_param({{"parallel_tool_calls", false}}), "parallel_tool_calls");
  EXPECT_EQ(chat_param({{"store", true}}), "store");
  EXPECT_EQ(chat_param({{"service_tier", "flex"}}), "service_tier");
  EXPECT_EQ(chat_param({{"modalities", {"text", "audio"}}}), "modalities");
  EXPECT_EQ(chat_param({{"reasoning_effort", "extreme"}}), "reasoning_effort");
  EXPECT_EQ(chat_param({{"reasoning_effort", "none"}, {"chat_template_kwargs", {{"enable_thinking", true}}}}),
            "reasoning_effort");
  EXPECT_EQ(parse_openai_request(chat_body({{"reasoning_effort", "none"}}), true, kCtx).thinking, false);
  EXPECT_EQ(parse_openai_request(chat_body({{"reasoning_effort", "high"}}), true, kCtx).thinking, true);
}

// What asks for constrained output is read into one OutputConstraint, or refused naming
// the field: a forced call needs tools and a tool that exists, one constraint per request.
TEST(RequestFields, ConstraintsAreReadOrRefusedByName) {
  using Kind = OutputConstraint::Kind;
  // Bodies as JSON text: deep brace initializers make the compiler crawl.
  const auto chat = [](const std::string& extra) {
    return parse_openai_request(chat_body(ojson::parse(extra)), true, kCtx).constraint;
  };
  const auto chat_param = [](const std::string& extra) { return rejected_param(chat_body(ojson::parse(extra))); };
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const auto with_tools = [&](const std::string& more) { return "{" + tools + ", " + more + "}"; };
  EXPECT_EQ(chat(with_tools(R"("tool_choice": "required")")).kind, Kind::kToolCall);
  const OutputConstraint named = chat(with_tools(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(named.kind, Kind::kToolCall);
  EXPECT_EQ(named.tool, "f");
  EXPECT_EQ(chat_param(with_tools(R"("tool_choice": {"type": "function", "function": {"name": "g"}})")), "tool_choice");
  EXPECT_EQ(chat_param(R"({"tool_choice": "required"})"), "tool_choice");  // no tools
  EXPECT_EQ(chat_param(R"({"tool_choice": "sometimes"})"), "tool_choice");
  EXPECT_EQ(chat(R"({"response_format": {"type": "json_object"}})").kind, Kind::kJsonObject);
  const OutputConstraint schema =
      chat(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}})");
  EXPECT_EQ(schema.kind, Kind::kJsonSchema);
  EXPECT_EQ(schema.field, "response_format.json_schema.schema");
  EXPECT_EQ(schema.schema, ojson::parse(R"({"type": "integer"})"));
  EXPECT_EQ(chat_param(R"({"response_format": {"type": "xml"}})"), "response_format.type");
  EXPECT_EQ(chat_param(R"({"response_format": {"type": "json_schema"}})"), "response_format.json_schema");
  EXPECT_EQ(chat_param(R"({"guided_regex": "a", "guided_choice": ["a"]})"), "guided_choice");
  EXPECT_EQ(chat_param(R"({"guided_choice": []})"), "guided_choice");
  EXPECT_EQ(chat_param(R"({"guided_json": 5})"), "guided_json");
  EXPECT_EQ(chat(R"({"guided_json": "{\"type\": \"string\"}"})").schema, ojson::parse(R"({"type": "string"})"));
  for (const std::string type : {"any", "tool"}) {
    ojson body = ojson::parse(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                                  "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"name": "f"}})");
    body["tool_choice"]["type"] = type;
    const OutputConstraint c = parse_anthropic_request(body, kCtx).constraint;
    EXPECT_EQ(c.kind, Kind::kToolCall) << type;
    EXPECT_EQ(c.tool, type == "tool" ? "f" : "") << type;
    if (type != "tool") continue;
    body["tool_choice"]["name"] = "g";
    try {
      parse_anthropic_request(body, kCtx);
      ADD_FAILURE() << "a tool_choice naming no tool was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "tool_choice.name");
    }
  }
}

}  // namespace
}  // namespace kettle::server

namespace kettle::server {
namespace {

// The Responses store: the oldest entries go first past the byte cap; one larger than the
// cap is not kept; erase forgets; the TTL is the e2e test's (--response-ttl 1).
TEST(ResponseStore, OldestGoFirstPastTheByteCap) {
  const auto entry = [](int i) {
    return ResponseStore::Entry{{{"id", i}, {"pad", std::string(100, 'x')}}, ojson::array({{{"role", "user"}}})};
  };
  const size_t one = std::string("resp_0").size() + entry(0).response.dump().size() + entry(0).conversation.dump().size();
  ResponseStore store(3 * one, std::chrono::seconds(3600));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(store.put("resp_" + std::to_string(i), entry(i)));
  EXPECT_LE(store.bytes(), 3 * one);
  EXPECT_FALSE(store.get("resp_0"));
  EXPECT_FALSE(store.get("resp_1"));
  for (int i = 2; i < 5; ++i) EXPECT_EQ(store.get("resp_" + std::to_string(i))->response["id"], i);
  EXPECT_TRUE(store.erase("resp_3"));
  EXPECT_FALSE(store.erase("resp_3"));
  EXPECT_FALSE(store.get("resp_3"));
  ResponseStore tiny(10, std::chrono::seconds(3600));
  EXPECT_FALSE(tiny.put("resp_x", entry(1)));
  EXPECT_EQ(tiny.bytes(), 0u);
}

}  // namespace
}  // namespace kettle::server

namespace kettle::server {
namespace {

// Responses input items become the messages chat templates take: calls join the assistant
// message before them, outputs are tool messages, reasoning rides on the next assistant
// message; the stored conversation of previous_response_id comes first, instructions
// first of all (and are not part of what is stored).
TEST(ResponsesRequest, InputItemsBecomeTemplateMessages) {
  ResponseStore store(1 << 20, std::chrono::seconds(3600));
  store.put("resp_1", {ojson::object(), ojson::array({{{"role", "user"}, {"content", "earlier"}}})});
  const ojson call_a = {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{\"x\":1}"}};
  const ojson call_b = {{"type", "function_call"}, {"call_id", "c2"}, {"name", "g"}, {"arguments", "not json"}};
  ojson input = ojson::array();
  input.push_back({{"role", "user"},
                   {"content", ojson::array({{{"type", "input_text"}, {"text", "hi "}},
                                             {{"type", "input_text"}, {"text", "there"}}})}});
  input.push_back({{"type", "message"}, {"role", "assistant"}, {"content", "Let me check"}});
  input.push_back(call_a);
  input.push_back(call_b);
  input.push_back({{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "one"}});
  input.push_back({{"type", "function_call_output"}, {"call_id", "c2"}, {"output", "two"}});
  input.push_back({{"type", "reasoning"}, {"content", ojson::array({{{"type", "reasoning_text"}, {"text", "thought"}}})}});
  input.push_back({{"role", "assistant"}, {"content", "done"}});
  const ojson body = {{"previous_response_id", "resp_1"}, {"instructions", "be brief"}, {"input", input}};
  const ResponsesRequest r = parse_responses_request(body, kCtx, store);
  const ojson expected = ojson::array({
      {{"role", "system"}, {"content", "be brief"}},
      {{"role", "user"}, {"content", "earlier"}},
      {{"role", "user"}, {"content", "hi there"}},
      {{"role", "assistant"},
       {"content", "Let me check"},
       {"tool_calls",
        {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}},
         {{"id", "c2"}, {"type", "function"}, {"function", {{"name", "g"}, {"arguments", "not json"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "one"}},
      {{"role", "tool"}, {"tool_call_id", "c2"}, {"content", "two"}},
      {{"role", "assistant"}, {"content", "done"}, {"reasoning_content", "thought"}},
  });
  EXPECT_EQ(r.params.messages, expected);
  EXPECT_EQ(r.conversation.size(), expected.size() - 1);  // without the instructions
  EXPECT_EQ(r.previous_response_id, "resp_1");
  // A reasoning item must lead to an assistant item; an unknown id is a 404.
  try {
    parse_responses_request({{"input", {{{"type", "reasoning"}, {"summary", {{{"text", "x"}}}}}}}}, kCtx, store);
    ADD_FAILURE() << "a trailing reasoning item was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "input");
  }
  try {
    parse_responses_request({{"input", "hi"}, {"previous_response_id", "resp_none"}}, kCtx, store);
    ADD_FAILURE() << "an unknown previous_response_id was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
  }
}

}  // namespace
}  // namespace kettle::server

namespace kettle::server {
namespace {

TEST(Embeddings, Base64IsRfc4648Padded) {
  EXPECT_EQ(base64_encode("Man", 3), "TWFu");
  EXPECT_EQ(base64_encode("Ma", 2), "TWE=");
  EXPECT_EQ(base64_encode("M", 1), "TQ==");
  EXPECT_EQ(base64_encode("", 0), "");
  const unsigned char high[] = {0xFB, 0xFF, 0xBF};
  EXPECT_EQ(base64_encode(high, 3), "+/+/");
  const float one = 1.0f;  // little-endian 00 00 80 3F
  EXPECT_EQ(base64_encode(&one, sizeof one), "AACAPw==");
}

TEST(Embeddings, InputsInEveryShapeOpenAiTakes) {
  using nlohmann::ordered_json;
  EXPECT_EQ(parse_embeddings_request({{"input", "a"}}, 10).texts, std::vector<std::string>{"a"});
  EXPECT_EQ(parse_embeddings_request({{"input", {"a", "b"}}}, 10).texts, (std::vector<std::string>{"a", "b"}));
  const EmbeddingsParams ids = parse_embeddings_request({{"input", {1, 2, 3}}}, 10);
  ASSERT_EQ(ids.token_inputs.size(), 1u);
  EXPECT_EQ(ids.token_inputs[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_embeddings_request(ordered_json::parse(R"({"input": [[1], [2, 3]]})"), 10).count(), 2u);
  EXPECT_FALSE(parse_embeddings_request({{"input", "a"}}, 10).base64);
  EXPECT_TRUE(parse_embeddings_request({{"input", "a"}, {"encoding_format", "base64"}}, 10).base64);
  EXPECT_EQ(parse_embeddings_request({{"input", "a"}, {"dimensions", 8}}, 10).dimensions, 8);
}

}  // namespace
}  // namespace kettle::server
