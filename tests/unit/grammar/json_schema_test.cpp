// JSON Schema → grammar: what each keyword accepts and refuses, checked on texts
// whose validity is plain from the schema; refusals name the schema path. (Outputs
// of real models under 40 schemas are checked by ajv in tests/e2e/serve_structured.)
#include <gtest/gtest.h>

#include "grammar/constraint.h"
#include "grammar/json_schema_gbnf.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

using ordered_json = nlohmann::ordered_json;

bool accepts(const std::string& schema, std::string_view text) {
  std::vector<std::string> bytes(257);
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  auto vocab = std::make_shared<TokenVocabulary>(std::move(bytes), std::vector<int32_t>{256});
  auto c = std::make_shared<Constraint>(parse_gbnf(json_schema_gbnf(ordered_json::parse(schema), "schema")), vocab,
                                        "test");
  ConstraintMatcher m(c);
  for (char ch : text)
    if (!m.accept(static_cast<uint8_t>(ch))) return false;
  return m.accepting();
}

std::string refusal(const std::string& schema) {
  try {
    json_schema_gbnf(ordered_json::parse(schema), "schema");
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    return e.what();
  }
  return "(accepted)";
}

TEST(JsonSchema, ObjectsKeepTheirPropertiesInOrder) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
    "c":{"type":"boolean"}},"required":["a","c"]})";
  EXPECT_TRUE(accepts(s, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(accepts(s, R"({"a":-5,"c":false})"));
  EXPECT_FALSE(accepts(s, R"({"a":1})"));               // c is required
  EXPECT_FALSE(accepts(s, R"({"c":true,"a":1})"));      // the schema's order
  EXPECT_FALSE(accepts(s, R"({"a":1,"c":true,"d":1})"));  // no additional properties by default
  EXPECT_FALSE(accepts(s, R"({"a":1.5,"c":true})"));
}

TEST(JsonSchema, AdditionalPropertiesWhenAsked) {
  EXPECT_TRUE(accepts(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"x":1,"y":2})"));
  EXPECT_FALSE(accepts(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"x":"1"})"));
  EXPECT_TRUE(accepts(R"({"type":"object"})", R"({"any":[1,{"b":null}]})"));
  EXPECT_TRUE(accepts(R"({"properties":{"a":{}},"additionalProperties":true})", R"({"a":1,"z":"q"})"));
  const std::string named = R"({"type":"object","propertyNames":{"pattern":"^x[0-9]$"},"additionalProperties":{"type":"integer"}})";
  EXPECT_TRUE(accepts(named, R"({"x1":1,"x2":2})"));
  EXPECT_FALSE(accepts(named, R"({"y1":1})"));
  const std::string counted = R"({"type":"object","minProperties":1,"maxProperties":2,"additionalProperties":{"type":"integer"}})";
  EXPECT_FALSE(accepts(counted, "{}"));
  EXPECT_TRUE(accepts(counted, R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(counted, R"({"a":1,"b":2,"c":3})"));
}

TEST(JsonSchema, ArraysEnumsConstAndUnions) {
  EXPECT_TRUE(accepts(R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":2})", R"(["x", "y"])"));
  EXPECT_FALSE(accepts(R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":2})", R"([])"));
  EXPECT_FALSE(accepts(R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":2})", R"(["x","x","x"])"));
  EXPECT_TRUE(accepts(R"({"const":{"k":[1,2]}})", R"({"k":[1,2]})"));
  EXPECT_TRUE(accepts(R"({"anyOf":[{"type":"string"},{"type":"null"}]})", "null"));
  EXPECT_TRUE(accepts(R"({"type":["integer","null"]})", "12"));
  EXPECT_FALSE(accepts(R"({"type":["integer","null"]})", "true"));
  EXPECT_TRUE(accepts(R"({"prefixItems":[{"type":"integer"},{"type":"string"}],"items":false})", R"([1,"a"])"));
}

TEST(JsonSchema, RefsIncludingRecursion) {
  const std::string s = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(accepts(s, R"({"v":1,"next":{"v":2,"next":null}})"));
  EXPECT_FALSE(accepts(s, R"({"v":1,"next":{"v":2}})"));
}

TEST(JsonSchema, StringsFormatsAndPatterns) {
  EXPECT_TRUE(accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("abc")"));
  EXPECT_FALSE(accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(accepts(R"({"type":"string","format":"date"})", R"("2024-02-28")"));
  EXPECT_FALSE(accepts(R"({"type":"string","format":"date"})", R"("2024-02-30")"));
  EXPECT_TRUE(accepts(R"({"type":"string","format":"date-time"})", R"("2024-12-03T10:00:00Z")"));
  EXPECT_TRUE(accepts(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(accepts(R"({"type":"string","pattern":"^[A-Z]{3}-\\d+$"})", R"("ABC-42")"));
  EXPECT_FALSE(accepts(R"({"type":"string","pattern":"^[A-Z]{3}-\\d+$"})", R"("AB-42")"));
  EXPECT_TRUE(accepts(R"({"type":"string","pattern":"x"})", R"("abxcd")"));  // patterns search
}

TEST(JsonSchema, NumericBounds) {
  const std::string s = R"({"type":"integer","minimum":-12,"maximum":305})";
  for (int v = -30; v <= 320; ++v) EXPECT_EQ(accepts(s, std::to_string(v)), v >= -12 && v <= 305) << v;
  EXPECT_FALSE(accepts(s, "007"));
  EXPECT_TRUE(accepts(R"({"type":"integer","exclusiveMinimum":0})", "1"));
  EXPECT_FALSE(accepts(R"({"type":"integer","exclusiveMinimum":0})", "0"));
  const std::string n = R"({"type":"number","minimum":-1,"maximum":2})";
  EXPECT_TRUE(accepts(n, "1.75"));
  EXPECT_TRUE(accepts(n, "-0.5"));
  EXPECT_TRUE(accepts(n, "2.000"));
  EXPECT_FALSE(accepts(n, "2.5"));
  EXPECT_FALSE(accepts(n, "-1.5"));
}

TEST(JsonSchema, RefusalsNameThePath) {
  EXPECT_NE(refusal(R"({"properties":{"a":{"not":{"type":"string"}}}})").find("schema.properties.a: the keyword 'not'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"hostname"})").find("schema.format"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"https://example.com/s.json"})").find("schema.$ref"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","minimum":0.5})").find("schema.minimum"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","pattern":"(a)\\1"})").find("schema.pattern"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","minItems":3,"maxItems":2})").find("schema.maxItems"), std::string::npos);
  EXPECT_NE(refusal("false").find("accepts nothing"), std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"properties":{"a":{}},"additionalProperties":false},{"properties":{"b":{}}}]})")
                .find("forbids 'b'"),
            std::string::npos);
}

}  // namespace
}  // namespace kettle::grammar
