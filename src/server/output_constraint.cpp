#include "server/output_constraint.h"

#include <fmt/format.h>

#include "grammar/gbnf_text.h"
#include "grammar/json_schema_gbnf.h"
#include "grammar/regex_gbnf.h"
#include "server/request_fields.h"
#include "util/error.h"

namespace kettle::server {
namespace {

using Kind = OutputConstraint::Kind;

constexpr size_t kMaxConstraintText = 64 * 1024;  // a regex or grammar's bytes
constexpr size_t kMaxChoices = 1024;

void set(CompletionParams& p, OutputConstraint c) {
  if (p.constraint.kind != Kind::kNone)
    throw ApiError(400, fmt::format("'{}' and '{}' both constrain the output; send one", p.constraint.field, c.field),
                   c.field);
  p.constraint = std::move(c);
}

// A JSON schema given as an object (or, for guided_json, as its JSON text).
ordered_json schema_of(const ordered_json& value, const std::string& name) {
  if (value.is_object() || value.is_boolean()) return value;
  if (value.is_string()) {
    ordered_json parsed = ordered_json::parse(value.get<std::string>(), nullptr, false);
    if (parsed.is_object() || parsed.is_boolean()) return parsed;
  }
  bad_field(name, "a JSON schema (an object)");
}

void parse_json_schema_format(const ordered_json& format, const std::string& name, bool flat, CompletionParams& p) {
  // Chat: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; Responses: the same keys flat.
  const ordered_json* spec = &format;
  std::string where = name;
  if (!flat) {
    if (!format.contains("json_schema") || !format["json_schema"].is_object())
      bad_field(name + ".json_schema", "an object {\"name\", \"schema\", \"strict\"}");
    spec = &format["json_schema"];
    where = name + ".json_schema";
  }
  if (spec->contains("strict") && !(*spec)["strict"].is_boolean() && !(*spec)["strict"].is_null())
    bad_field(where + ".strict", "a boolean");
  OutputConstraint c = OutputConstraint::of(Kind::kJsonSchema, where + ".schema");
  if (!spec->contains("schema") || (*spec)["schema"].is_null())
    c.schema = ordered_json::object();  // no schema: any JSON value (as OpenAI's json_object, any type)
  else
    c.schema = schema_of((*spec)["schema"], where + ".schema");
  set(p, std::move(c));
}

// "<think>" free text "</think>" first, where the model reasons (optional unless the
// prompt already opened it), then `body`.
std::string with_reasoning(const std::string& body, const OutputParserOptions& parse) {
  std::string out;
  if (!parse.format.reasoning) return fmt::format("{} ::= {}\n", kConstraintRoot, body);
  const std::string think = "kettle-think";
  const std::string block = fmt::format("{} \"</think>\" [ \\t\\n]{{0,8}}", think);
  if (parse.starts_in_reasoning)
    out = fmt::format("{} ::= {} {}\n", kConstraintRoot, block, body);
  else
    out = fmt::format("{} ::= ( \"<think>\" {} )? {}\n", kConstraintRoot, block, body);
  return out + grammar::gbnf_text_without(think, "</think>");
}

const ordered_json* find_tool(const ordered_json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const ordered_json& t : tools)
    if (t.contains("function") && field_is(t["function"], "name", name)) return &t;
  return nullptr;
}

// One call's JSON in the model's syntax: {"name": "<name>", "<arguments key>": <its schema>}.
std::string tool_calls_gbnf(const OutputConstraint& c, const OutputParserOptions& parse, const ordered_json& tools,
                            grammar::JsonGrammarWriter& json) {
  const char* arguments_key = nullptr;
  switch (parse.format.tool_calls) {
    case ToolCallFormat::kHermes: arguments_key = "arguments"; break;
    case ToolCallFormat::kLlama3Json: arguments_key = "parameters"; break;
    case ToolCallFormat::kNone:
      throw ApiError(400, "this model's chat template has no tool-call syntax, so a call cannot be forced; send "
                          "'tool_choice': \"auto\"", c.field);
  }
  std::vector<std::string> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!c.tool.empty() && name != c.tool) continue;
    const ordered_json params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"]
                                                                                         : ordered_json::object();
    const std::string args = json.add(params, fmt::format("tools[{}].function.parameters", i));
    calls.push_back(fmt::format("{} ws \",\" ws {} ws \":\" ws {}", grammar::gbnf_quote(ordered_json(name).dump()),
                                grammar::gbnf_quote(fmt::format("\"{}\"", arguments_key)), args));
  }
  std::string one = "\"{\" ws \"\\\"name\\\"\" ws \":\" ws ( ";
  for (size_t i = 0; i < calls.size(); ++i) one += (i ? " | " : "") + calls[i];
  one += " ) ws \"}\"";
  if (parse.format.tool_calls == ToolCallFormat::kHermes)
    return fmt::format("( [ \\n]{{0,2}} \"<tool_call>\" [ \\n]{{0,2}} {} [ \\n]{{0,2}} \"</tool_call>\" ){{1,8}}", one);
  return one;
}

}  // namespace

void parse_openai_constraint(const ordered_json& body, CompletionParams& p) {
  if (const ordered_json* format = field(body, "response_format")) {
    if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
      bad_field("response_format", "an object with a 'type'");
    const std::string type = (*format)["type"].get<std::string>();
    if (type == "json_object")
      set(p, OutputConstraint::of(Kind::kJsonObject, "response_format"));
    else if (type == "json_schema")
      parse_json_schema_format(*format, "response_format", false, p);
    else if (type != "text")
      bad_field("response_format.type", "\"text\", \"json_object\" or \"json_schema\"");
  }
  if (const ordered_json* schema = field(body, "guided_json")) {
    OutputConstraint c = OutputConstraint::of(Kind::kJsonSchema, "guided_json");
    c.schema = schema_of(*schema, "guided_json");
    set(p, std::move(c));
  }
  if (const ordered_json* regex = field(body, "guided_regex")) {
    if (!regex->is_string() || regex->get<std::string>().size() > kMaxConstraintText)
      bad_field("guided_regex", fmt::format("a regular expression of at most {} bytes", kMaxConstraintText));
    OutputConstraint c = OutputConstraint::of(Kind::kRegex, "guided_regex");
    c.text = regex->get<std::string>();
    set(p, std::move(c));
  }
  if (const ordered_json* grammar = field(body, "guided_grammar")) {
    if (!grammar->is_string() || grammar->get<std::string>().size() > kMaxConstraintText)
      bad_field("guided_grammar", fmt::format("a GBNF grammar of at most {} bytes", kMaxConstraintText));
    OutputConstraint c = OutputConstraint::of(Kind::kGrammar, "guided_grammar");
    c.text = grammar->get<std::string>();
    set(p, std::move(c));
  }
  if (const ordered_json* choice = field(body, "guided_choice")) {
    if (!choice->is_array() || choice->empty() || choice->size() > kMaxChoices)
      bad_field("guided_choice", fmt::format("a list of 1 to {} strings", kMaxChoices));
    OutputConstraint c = OutputConstraint::of(Kind::kChoice, "guided_choice");
    for (const ordered_json& s : *choice) {
      if (!s.is_string() || s.get<std::string>().empty()) bad_field("guided_choice", "non-empty strings");
      c.choices.push_back(s.get<std::string>());
    }
    set(p, std::move(c));
  }
}

void parse_openai_tool_choice(const ordered_json& body, const ordered_json& tools, CompletionParams& p) {
  const ordered_json* choice = field(body, "tool_choice");
  if (!choice || *choice == "auto" || *choice == "none") return;
  OutputConstraint c = OutputConstraint::of(Kind::kToolCall, "tool_choice");
  if (*choice == "required") {
    // any of the tools
  } else if (choice->is_object() && field_is(*choice, "type", "function")) {
    const ordered_json* name = nullptr;
    if (choice->contains("function") && (*choice)["function"].is_object() && (*choice)["function"].contains("name"))
      name = &(*choice)["function"]["name"];
    else if (choice->contains("name"))
      name = &(*choice)["name"];
    if (name == nullptr || !name->is_string()) bad_field("tool_choice.function.name", "a string");
    c.tool = name->get<std::string>();
    if (!find_tool(tools, c.tool))
      throw ApiError(400, fmt::format("'tool_choice' names '{}', which is not among the request's tools", c.tool),
                     "tool_choice");
  } else {
    bad_field("tool_choice", "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
  }
  if (!tools.is_array() || tools.empty())
    throw ApiError(400, "'tool_choice' forces a call, but the request has no tools", "tool_choice");
  set(p, std::move(c));
}

void parse_responses_text_format(const ordered_json& format, CompletionParams& p) {
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    bad_field("text.format", "an object with a 'type'");
  const std::string type = format["type"].get<std::string>();
  if (type == "json_object")
    set(p, OutputConstraint::of(Kind::kJsonObject, "text.format"));
  else if (type == "json_schema")
    parse_json_schema_format(format, "text.format", true, p);
  else if (type != "text")
    bad_field("text.format.type", "\"text\", \"json_object\" or \"json_schema\"");
}

void parse_anthropic_tool_choice(const ordered_json& body, const ordered_json& tools, CompletionParams& p) {
  const ordered_json* choice = field(body, "tool_choice");
  if (!choice) return;
  if (!choice->is_object() || !choice->contains("type") || !(*choice)["type"].is_string())
    bad_field("tool_choice", "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
  for (const auto& [key, value] : choice->items())
    if (key != "type" && key != "name" && key != "disable_parallel_tool_use")
      throw ApiError(400, fmt::format("'tool_choice.{}' is not supported", key), "tool_choice." + key);
  if (choice->contains("disable_parallel_tool_use") && (*choice)["disable_parallel_tool_use"] == true)
    throw ApiError(400, "'tool_choice.disable_parallel_tool_use': true is not supported: a turn may return several "
                        "calls", "tool_choice.disable_parallel_tool_use");
  const std::string type = (*choice)["type"].get<std::string>();
  if (type == "auto" || type == "none") return;
  if (type != "any" && type != "tool") bad_field("tool_choice.type", "\"auto\", \"any\", \"tool\" or \"none\"");
  OutputConstraint c = OutputConstraint::of(Kind::kToolCall, "tool_choice");
  if (type == "tool") {
    if (!choice->contains("name") || !(*choice)["name"].is_string()) bad_field("tool_choice.name", "a string");
    c.tool = (*choice)["name"].get<std::string>();
    if (!find_tool(tools, c.tool))
      throw ApiError(400, fmt::format("'tool_choice' names '{}', which is not among the request's tools", c.tool),
                     "tool_choice.name");
  }
  if (!tools.is_array() || tools.empty())
    throw ApiError(400, "'tool_choice' forces a call, but the request has no tools", "tool_choice");
  set(p, std::move(c));
}

std::string constraint_gbnf(const OutputConstraint& c, const OutputParserOptions& parse, const ordered_json& tools) {
  try {
    grammar::JsonGrammarWriter json;
    switch (c.kind) {
      case Kind::kNone: return {};
      case Kind::kJsonObject: return with_reasoning(json.any_object(), parse) + json.rules();
      case Kind::kJsonSchema: {
        const std::string value = json.add(c.schema, c.field);
        return with_reasoning(value, parse) + json.rules();
      }
      case Kind::kRegex:
        return with_reasoning("kettle-regex", parse) +
               grammar::regex_to_gbnf(c.text, "kettle-regex", grammar::RegexMode::kFullMatch);
      case Kind::kChoice: {
        std::string alts;
        for (size_t i = 0; i < c.choices.size(); ++i) alts += (i ? " | " : "") + grammar::gbnf_quote(c.choices[i]);
        return with_reasoning("( " + alts + " )", parse);
      }
      case Kind::kGrammar: return c.text + "\n" + with_reasoning("root", parse);
      case Kind::kToolCall: {
        const std::string calls = tool_calls_gbnf(c, parse, tools, json);
        return with_reasoning(calls, parse) + json.rules();
      }
    }
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("'{}' cannot be enforced: {}", c.field, e.what()), c.field);
  }
  return {};
}

}  // namespace kettle::server
