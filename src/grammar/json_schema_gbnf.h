// JSON Schema → GBNF: the grammar of the JSON texts a schema accepts, for
// structured output and tool arguments.
//
// Supported (what function-calling schemas use): type (one or a list), properties,
// required, additionalProperties (false when absent, as xgrammar's strict mode and
// vLLM do: only the listed properties, in their order), items, prefixItems,
// minItems, maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of object schemas
// (merged), $ref to #/$defs/… and #/definitions/… (recursion allowed), nullable;
// strings with minLength/maxLength, pattern (a regular expression, searched as
// JSON Schema does) or format (date, time, date-time, uuid, email, ipv4, uri);
// integers with minimum/maximum/exclusive bounds; numbers with integer-valued bounds.
// Annotations (title, description, default, examples, $schema, $id, $comment, …)
// are ignored. Anything else is refused with an error naming its schema path.
//
// Whitespace between tokens is at most one space (compact JSON, as a model cannot run
// away in indentation), numbers have at most 16 digits before and after the point.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace kettle::grammar {

class JsonGrammarWriter {
 public:
  JsonGrammarWriter() = default;
  // The rule matching the JSON values `document` accepts ($refs resolved inside it);
  // `path` names it in errors (e.g. "response_format.json_schema.schema").
  std::string add(const nlohmann::ordered_json& document, const std::string& path);
  // The rule of any JSON object / value.
  static std::string any_object() { return "json-object"; }
  static std::string any_value() { return "json-value"; }
  // Every rule added, with the shared JSON rules (ws, json-string, json-value, …).
  std::string rules() const;

 private:
  std::string visit(const nlohmann::ordered_json& schema, const std::string& path);
  std::string visit_typed(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  std::string object_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string array_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string string_rule(const nlohmann::ordered_json& schema, const std::string& path);
  std::string number_rule(const nlohmann::ordered_json& schema, bool integer, const std::string& path);
  std::string ref_rule(const std::string& ref, const std::string& path);
  std::string literal_rule(const nlohmann::ordered_json& value);
  std::string define(const std::string& body);  // a new rule; its name
  std::string define_named(const std::string& name, const std::string& body);

  const nlohmann::ordered_json* document_ = nullptr;
  int documents_ = 0;
  std::map<std::string, std::string> refs_;  // "document#ref" → rule
  std::map<std::string, std::string> formats_;
  std::string rules_;
  int count_ = 0;
};

// root ::= a JSON value `schema` accepts.
std::string json_schema_gbnf(const nlohmann::ordered_json& schema, const std::string& path);
// root ::= any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace kettle::grammar
