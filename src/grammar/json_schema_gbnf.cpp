#include "grammar/json_schema_gbnf.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "grammar/gbnf_text.h"
#include "grammar/regex_gbnf.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kMaxDigits = 16;
constexpr int64_t kLargest = 9999999999999999;  // 16 digits

const char* kJsonRules = R"(ws ::= " "?
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-bool ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null
json-object ::= "{" ws ( json-member ws ( "," ws json-member ws )* )? "}"
json-member ::= json-string ws ":" ws json-value
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";

// Keywords that only annotate: they constrain nothing.
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "$anchor", "contentEncoding",
                                            "contentMediaType"};
// Keywords this converter applies (each where its type is the instance's).
const std::set<std::string> kApplied = {"type", "properties", "required", "additionalProperties", "items",
                                        "prefixItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf",
                                        "allOf", "$ref", "$defs", "definitions", "nullable", "minLength", "maxLength",
                                        "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum", "propertyNames", "minProperties",
                                        "maxProperties"};

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  fail(ErrorCategory::kInvalidArgument, "{}: {}", path, what);
}

std::string json_literal(const ordered_json& value) { return gbnf_quote(value.dump()); }

// Decimal spellings (no leading zeros) of the integers in [lo, hi], lo and hi of `d` digits.
void same_length(const std::string& lo, const std::string& hi, const std::string& prefix,
                 std::vector<std::string>& alts) {
  if (lo.empty()) {
    alts.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  auto join = [&](const std::string& more) { return prefix.empty() ? more : prefix + " " + more; };
  if (lo == hi) {
    alts.push_back(join(gbnf_quote(lo)));
    return;
  }
  const char lf = lo[0], hf = hi[0];
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  const size_t rest = lo_rest.size();
  if (lf == hf) {
    same_length(lo_rest, hi_rest, join(gbnf_quote(std::string(1, lf))), alts);
    return;
  }
  const bool lo_full = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_full = hi_rest.find_first_not_of('9') == std::string::npos;
  if (!lo_full) same_length(lo_rest, std::string(rest, '9'), join(gbnf_quote(std::string(1, lf))), alts);
  const char start = static_cast<char>(lf + (lo_full ? 0 : 1)), end = static_cast<char>(hf - (hi_full ? 0 : 1));
  if (start <= end) {
    std::string body = start == end ? gbnf_quote(std::string(1, start)) : fmt::format("[{}-{}]", start, end);
    if (rest > 0) body += fmt::format(" [0-9]{{{}}}", rest);
    alts.push_back(join(body));
  }
  if (!hi_full) same_length(std::string(rest, '0'), hi_rest, join(gbnf_quote(std::string(1, hf))), alts);
}

void non_negative(int64_t lo, int64_t hi, const std::string& prefix, std::vector<std::string>& alts) {
  int64_t first = 0, last = 9;
  for (int d = 1; d <= kMaxDigits; ++d) {
    const int64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a <= b) {
      std::vector<std::string> part;
      same_length(std::to_string(a), std::to_string(b), "", part);
      for (const std::string& p : part) alts.push_back(prefix.empty() ? p : prefix + " " + p);
    }
    first = last + 1;
    if (last > kLargest / 10) break;
    last = last * 10 + 9;
  }
}

std::string alternatives(const std::vector<std::string>& alts) {
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out;
}

// An integer bound as a whole number (false when it is not one).
bool whole(const ordered_json& v, int64_t& out) {
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > static_cast<double>(kLargest)) return false;
  out = static_cast<int64_t>(d);
  return true;
}

}  // namespace

std::string JsonGrammarWriter::define(const std::string& body) { return define_named(fmt::format("s{}", ++count_), body); }

std::string JsonGrammarWriter::define_named(const std::string& name, const std::string& body) {
  rules_ += name + " ::= " + body + "\n";
  return name;
}

std::string JsonGrammarWriter::rules() const { return std::string(kJsonRules) + rules_; }

std::string JsonGrammarWriter::add(const ordered_json& document, const std::string& path) {
  const ordered_json* saved = document_;
  document_ = &document;
  ++documents_;
  std::string rule = visit(document, path);
  document_ = saved;
  return rule;
}

std::string JsonGrammarWriter::literal_rule(const ordered_json& value) { return json_literal(value); }

std::string JsonGrammarWriter::visit(const ordered_json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    refuse(path, "the schema false accepts nothing");
  }
  if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) {
    if (kAnnotations.contains(key) || kApplied.contains(key)) continue;
    refuse(path, fmt::format("the keyword '{}' is not supported by constrained decoding", key));
  }
  std::vector<std::string> alts;
  if (s.contains("$ref")) {
    if (s.size() > 1) {
      for (const auto& [key, value] : s.items())
        if (key != "$ref" && key != "$defs" && key != "definitions" && !kAnnotations.contains(key))
          refuse(path, fmt::format("'{}' beside '$ref' is not supported", key));
    }
    return ref_rule(s["$ref"].is_string() ? s["$ref"].get<std::string>() : "", path + ".$ref");
  }
  if (s.contains("const")) {
    alts.push_back(literal_rule(s["const"]));
  } else if (s.contains("enum")) {
    const ordered_json& e = s["enum"];
    if (!e.is_array() || e.empty()) refuse(path + ".enum", "expected a non-empty array");
    for (const ordered_json& v : e) alts.push_back(literal_rule(v));
  } else if (s.contains("anyOf") || s.contains("oneOf")) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const ordered_json& list = s[key];
    if (!list.is_array() || list.empty()) refuse(path + "." + key, "expected a non-empty array");
    for (size_t i = 0; i < list.size(); ++i) {
      ordered_json branch = list[i];
      // Siblings of anyOf (type, properties, …) apply to every branch.
      if (branch.is_object())
        for (const auto& [k, v] : s.items())
          if (k != key && !kAnnotations.contains(k) && !branch.contains(k) && k != "$defs" && k != "definitions")
            branch[k] = v;
      alts.push_back(visit(branch, fmt::format("{}.{}[{}]", path, key, i)));
    }
  } else if (s.contains("allOf")) {
    const ordered_json& list = s["allOf"];
    if (!list.is_array() || list.empty()) refuse(path + ".allOf", "expected a non-empty array");
    ordered_json merged = s;
    merged.erase("allOf");
    std::vector<const ordered_json*> closed;  // parts that allow no property but their own
    for (size_t i = 0; i < list.size(); ++i) {
      const ordered_json& part = list[i];
      const std::string where = fmt::format("{}.allOf[{}]", path, i);
      if (!part.is_object()) refuse(where, "expected an object schema");
      for (const auto& [k, v] : part.items()) {
        if (kAnnotations.contains(k)) continue;
        if (k == "properties" && v.is_object()) {
          for (const auto& [name, prop] : v.items()) {
            if (merged.contains("properties") && merged["properties"].contains(name) && merged["properties"][name] != prop)
              refuse(where + ".properties." + name, "allOf with two different schemas for one property is not supported");
            merged["properties"][name] = prop;
          }
        } else if (k == "required" && v.is_array()) {
          for (const ordered_json& r : v) merged["required"].push_back(r);
        } else if (k == "type" && v == "object") {
          merged["type"] = "object";
        } else if (k == "additionalProperties") {
          if (v == false) closed.push_back(&part);
          else if (v != true) refuse(where + ".additionalProperties", "allOf with an additionalProperties schema is not supported");
        } else {
          refuse(where, fmt::format("allOf is supported for object schemas (properties, required); '{}' is not", k));
        }
      }
    }
    // Each part is checked on its own: a closed part forbids the others' properties.
    if (merged.contains("properties"))
      for (const ordered_json* part : closed)
        for (const auto& [name, prop] : merged["properties"].items())
          if (!part->contains("properties") || !(*part)["properties"].contains(name))
            refuse(path + ".allOf", fmt::format("a part with additionalProperties false forbids '{}', which another "
                                                "part lists: no object satisfies every part", name));
    return visit(merged, path);
  } else if (s.contains("type")) {
    const ordered_json& t = s["type"];
    if (t.is_string()) {
      alts.push_back(visit_typed(s, t.get<std::string>(), path));
    } else if (t.is_array() && !t.empty()) {
      for (const ordered_json& one : t) {
        if (!one.is_string()) refuse(path + ".type", "expected type names");
        alts.push_back(visit_typed(s, one.get<std::string>(), path));
      }
    } else {
      refuse(path + ".type", "expected a type name or a non-empty list of them");
    }
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
    alts.push_back(visit_typed(s, "object", path));
  } else if (s.contains("items") || s.contains("prefixItems")) {
    alts.push_back(visit_typed(s, "array", path));
  } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
    alts.push_back(visit_typed(s, "string", path));
  } else {
    alts.push_back(any_value());
  }
  if (s.value("nullable", false)) alts.push_back("json-null");
  if (alts.size() == 1) return alts[0];
  return define(alternatives(alts));
}

std::string JsonGrammarWriter::visit_typed(const ordered_json& s, const std::string& type, const std::string& path) {
  if (type == "string") return string_rule(s, path);
  if (type == "integer") return number_rule(s, true, path);
  if (type == "number") return number_rule(s, false, path);
  if (type == "boolean") return "json-bool";
  if (type == "null") return "json-null";
  if (type == "object") return object_rule(s, path);
  if (type == "array") return array_rule(s, path);
  refuse(path + ".type", fmt::format("unknown type '{}'", type));
}

std::string JsonGrammarWriter::ref_rule(const std::string& ref, const std::string& path) {
  const std::string key = fmt::format("{}{}", documents_, ref);
  if (auto it = refs_.find(key); it != refs_.end()) return it->second;
  std::string pointer;
  if (ref == "#")
    pointer = "";
  else if (ref.starts_with("#/"))
    pointer = ref.substr(1);
  else
    refuse(path, fmt::format("only references inside the schema (\"#/...\") are supported, not '{}'", ref));
  const ordered_json* target = nullptr;
  try {
    target = &document_->at(ordered_json::json_pointer(pointer));
  } catch (const std::exception&) {
    refuse(path, fmt::format("'{}' points at nothing in the schema", ref));
  }
  // Named before it is visited, so a recursive reference finds it.
  const std::string name = fmt::format("ref{}", ++count_);
  refs_.emplace(key, name);
  const std::string body = visit(*target, path + "(" + ref + ")");
  define_named(name, body);
  return name;
}

std::string JsonGrammarWriter::object_rule(const ordered_json& s, const std::string& path) {
  struct Property {
    std::string name;
    const ordered_json* schema;
    bool required;
  };
  static const ordered_json kAny = true;
  std::vector<Property> props;
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) refuse(path + ".required", "expected an array of property names");
    for (const ordered_json& r : s["required"]) {
      if (!r.is_string()) refuse(path + ".required", "expected an array of property names");
      required.insert(r.get<std::string>());
    }
  }
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) refuse(path + ".properties", "expected an object");
    for (const auto& [name, schema] : s["properties"].items())
      props.push_back({name, &schema, required.contains(name)});
  }
  for (const std::string& name : required) {
    bool listed = false;
    for (const Property& p : props) listed = listed || p.name == name;
    if (!listed) props.push_back({name, &kAny, true});
  }
  // The rule of an additional property's value, or "" when there are none: none unless
  // the schema says so, when it lists properties; any when it lists none.
  std::string extra = s.contains("properties") || s.contains("required") ? "" : any_value();
  if (s.contains("additionalProperties")) {
    const ordered_json& a = s["additionalProperties"];
    if (a.is_boolean())
      extra = a.get<bool>() ? any_value() : "";
    else
      extra = visit(a, path + ".additionalProperties");
  }
  std::string key = "json-string";  // an additional property's name
  if (s.contains("propertyNames")) {
    const ordered_json& names = s["propertyNames"];
    if (!names.is_object() || (names.contains("type") && names["type"] != "string"))
      refuse(path + ".propertyNames", "expected a string schema");
    ordered_json as_string = names;
    as_string["type"] = "string";
    key = visit(as_string, path + ".propertyNames");
  }
  std::vector<std::string> member(props.size());
  for (size_t k = 0; k < props.size(); ++k) {
    const std::string value = visit(*props[k].schema, path + ".properties." + props[k].name);
    member[k] = define(fmt::format("{} ws \":\" ws {}", gbnf_quote(ordered_json(props[k].name).dump()), value));
  }
  const std::string extra_member = extra.empty() ? "" : define(fmt::format("{} ws \":\" ws {}", key, extra));
  int64_t min_props = 0, max_props = -1;
  if (s.contains("minProperties") && (!whole(s["minProperties"], min_props) || min_props < 0))
    refuse(path + ".minProperties", "expected a non-negative integer");
  if (s.contains("maxProperties") && (!whole(s["maxProperties"], max_props) || max_props < 0))
    refuse(path + ".maxProperties", "expected a non-negative integer");
  if (max_props >= 0 && max_props < min_props) refuse(path + ".maxProperties", "is below minProperties");
  if (min_props > 1000 || max_props > 1000) refuse(path, "minProperties and maxProperties above 1000 are not supported");
  if (s.contains("minProperties") || s.contains("maxProperties")) {
    // Counted over additional properties alone, or over listed ones when there are none.
    if (!props.empty() && !extra.empty())
      refuse(path, "minProperties / maxProperties with both listed and additional properties are not supported");
    if (props.empty() && !extra.empty()) {
      const std::string more = fmt::format("( \",\" ws {} ws ){{{},{}}}", extra_member, std::max<int64_t>(0, min_props - 1),
                                           max_props < 0 ? "" : std::to_string(std::max<int64_t>(0, max_props - 1)));
      const std::string some = fmt::format("{} ws {}", extra_member, more);
      if (max_props == 0) return define("\"{\" ws \"}\"");
      return define(min_props > 0 ? fmt::format("\"{{\" ws {} \"}}\"", some)
                                  : fmt::format("\"{{\" ws ( {} )? \"}}\"", some));
    }
    int64_t required_count = 0;
    for (const Property& p : props) required_count += p.required ? 1 : 0;
    if (required_count < min_props || (max_props >= 0 && static_cast<int64_t>(props.size()) > max_props))
      refuse(path, "minProperties / maxProperties that the listed properties do not already satisfy are not supported");
  }
  // first_k: the members from k on when none came before; rest_k: when one did (commas).
  const size_t n = props.size();
  std::vector<std::string> first(n + 1), rest(n + 1);
  const int id = ++count_;
  for (size_t k = n + 1; k-- > 0;) {
    first[k] = fmt::format("o{}-f{}", id, k);
    rest[k] = fmt::format("o{}-r{}", id, k);
  }
  for (size_t k = n + 1; k-- > 0;) {
    if (k == n) {
      define_named(first[k], extra.empty() ? "\"\"" : fmt::format("\"\" | {} ws {}", extra_member, rest[k]));
      define_named(rest[k], extra.empty() ? "\"\"" : fmt::format("\"\" | \",\" ws {} ws {}", extra_member, rest[k]));
      continue;
    }
    const std::string take_first = fmt::format("{} ws {}", member[k], rest[k + 1]);
    const std::string take_rest = fmt::format("\",\" ws {} ws {}", member[k], rest[k + 1]);
    define_named(first[k], props[k].required ? take_first : take_first + " | " + first[k + 1]);
    define_named(rest[k], props[k].required ? take_rest : take_rest + " | " + rest[k + 1]);
  }
  return define(fmt::format("\"{{\" ws {} \"}}\"", first[0]));
}

std::string JsonGrammarWriter::array_rule(const ordered_json& s, const std::string& path) {
  int64_t min = 0, max = -1;
  if (s.contains("minItems") && (!whole(s["minItems"], min) || min < 0))
    refuse(path + ".minItems", "expected a non-negative integer");
  if (s.contains("maxItems") && (!whole(s["maxItems"], max) || max < 0))
    refuse(path + ".maxItems", "expected a non-negative integer");
  if (max >= 0 && max < min) refuse(path + ".maxItems", "is below minItems: no array fits");
  if (min > 1000 || max > 1000) refuse(path, "minItems and maxItems above 1000 are not supported");
  std::vector<std::string> tuple;
  if (s.contains("prefixItems")) {
    const ordered_json& p = s["prefixItems"];
    if (!p.is_array()) refuse(path + ".prefixItems", "expected an array");
    for (size_t i = 0; i < p.size(); ++i) tuple.push_back(visit(p[i], fmt::format("{}.prefixItems[{}]", path, i)));
  }
  std::string item;  // the rule of items past the tuple, "" when none may follow
  if (s.contains("items")) {
    const ordered_json& it = s["items"];
    if (it.is_boolean())
      item = it.get<bool>() ? any_value() : "";
    else
      item = visit(it, path + ".items");
  } else {
    item = tuple.empty() ? any_value() : "";
  }
  if (!tuple.empty()) {
    const auto t = static_cast<int64_t>(tuple.size());
    if (t < min && item.empty()) refuse(path, "minItems asks for more items than prefixItems allows");
    if (max >= 0 && max < t) refuse(path, "maxItems is below the number of prefixItems");
    std::string body = "\"[\" ws";
    for (size_t i = 0; i < tuple.size(); ++i) body += fmt::format("{} {} ws", i ? " \",\" ws" : "", tuple[i]);
    if (!item.empty()) {
      const int64_t more_min = std::max<int64_t>(0, min - t), more_max = max < 0 ? -1 : max - t;
      body += fmt::format(" ( \",\" ws {} ws ){{{},{}}}", item, more_min, more_max < 0 ? "" : std::to_string(more_max));
    }
    return define(body + " \"]\"");
  }
  if (item.empty()) {
    if (min > 0) refuse(path, "minItems asks for items that 'items: false' forbids");
    return define("\"[\" ws \"]\"");
  }
  const std::string more = fmt::format("( \",\" ws {} ws ){{{},{}}}", item, std::max<int64_t>(0, min - 1),
                                       max < 0 ? "" : std::to_string(std::max<int64_t>(0, max - 1)));
  const std::string some = fmt::format("{} ws {}", item, more);
  if (max == 0) return define("\"[\" ws \"]\"");
  return define(min > 0 ? fmt::format("\"[\" ws {} \"]\"", some) : fmt::format("\"[\" ws ( {} )? \"]\"", some));
}

std::string JsonGrammarWriter::string_rule(const ordered_json& s, const std::string& path) {
  const bool has_length = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) refuse(path + ".pattern", "expected a string");
    if (has_length || s.contains("format")) refuse(path, "pattern together with minLength, maxLength or format is not supported");
    const std::string name = fmt::format("pat{}", ++count_);
    try {
      rules_ += regex_to_gbnf(s["pattern"].get<std::string>(), name, RegexMode::kJsonString, "json-char");
    } catch (const Error& e) {
      refuse(path + ".pattern", e.what());
    }
    return define(fmt::format("\"\\\"\" {} \"\\\"\"", name));
  }
  if (s.contains("format")) {
    if (!s["format"].is_string()) refuse(path + ".format", "expected a string");
    if (has_length) refuse(path, "format together with minLength or maxLength is not supported");
    const std::string format = s["format"].get<std::string>();
    static const std::map<std::string, std::string> kFormats = {
        {"date", R"(fmt-year "-" ( ( "01" | "03" | "05" | "07" | "08" | "10" | "12" ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "04" | "06" | "09" | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))"},
        {"time", R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
        {"uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
        {"email", R"([a-zA-Z0-9_+-]{1,64} ( "." [a-zA-Z0-9_+-]{1,64} ){0,4} "@" ( fmt-label "." ){1,4} fmt-label)"},
        {"ipv4", R"(fmt-octet "." fmt-octet "." fmt-octet "." fmt-octet)"},
        {"uri", R"("http" "s"? "://" fmt-label ( "." fmt-label ){0,4} ( "/" [a-zA-Z0-9._~-]{0,32} ){0,8})"},
    };
    if (formats_.empty()) {  // the shared pieces, once
      define_named("fmt-year", "[0-9]{4}");
      define_named("fmt-label", "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )?");
      define_named("fmt-octet", "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9]? [0-9]");
      define_named("fmt-date", kFormats.at("date"));
      define_named("fmt-time", kFormats.at("time"));
      formats_["shared"] = "";
    }
    std::string body;
    if (format == "date-time") {
      body = "fmt-date \"T\" fmt-time";
    } else if (auto it = kFormats.find(format); it != kFormats.end()) {
      body = it->second;
    } else {
      refuse(path + ".format", fmt::format("the format '{}' is not supported (date, time, date-time, uuid, email, "
                                           "ipv4 and uri are)", format));
    }
    return define(fmt::format("\"\\\"\" ( {} ) \"\\\"\"", body));
  }
  int64_t min = 0, max = -1;
  if (s.contains("minLength") && (!whole(s["minLength"], min) || min < 0))
    refuse(path + ".minLength", "expected a non-negative integer");
  if (s.contains("maxLength") && (!whole(s["maxLength"], max) || max < 0))
    refuse(path + ".maxLength", "expected a non-negative integer");
  if (max >= 0 && max < min) refuse(path + ".maxLength", "is below minLength: no string fits");
  if (min > 10000 || max > 10000) refuse(path, "minLength and maxLength above 10000 are not supported");
  if (min == 0 && max < 0) return "json-string";
  return define(fmt::format("\"\\\"\" json-char{{{},{}}} \"\\\"\"", min, max < 0 ? "" : std::to_string(max)));
}

std::string JsonGrammarWriter::number_rule(const ordered_json& s, bool integer, const std::string& path) {
  const bool bounded = s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                       s.contains("exclusiveMaximum");
  if (s.contains("multipleOf")) refuse(path + ".multipleOf", "is not supported");
  if (!bounded) return integer ? "json-int" : "json-number";
  int64_t lo = -kLargest, hi = kLargest;
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    if (!s.contains(key)) return;
    const ordered_json& v = s[key];
    if (!v.is_number()) refuse(path + "." + key, "expected a number");
    const double d = v.get<double>();
    if (!integer && (exclusive || d != std::floor(d)))
      refuse(path + "." + key, "bounds on a number are supported when they are inclusive whole numbers");
    if (std::fabs(d) > static_cast<double>(kLargest)) refuse(path + "." + key, "is beyond 16 digits");
    int64_t b = lower ? static_cast<int64_t>(std::ceil(d)) : static_cast<int64_t>(std::floor(d));
    if (exclusive && static_cast<double>(b) == d) b += lower ? 1 : -1;
    if (lower)
      lo = std::max(lo, b);
    else
      hi = std::min(hi, b);
  };
  bound("minimum", true, false);
  bound("exclusiveMinimum", true, true);
  bound("maximum", false, false);
  bound("exclusiveMaximum", false, true);
  if (lo > hi) refuse(path, "the bounds leave no value");
  std::vector<std::string> alts;
  if (integer) {
    if (hi >= 0) non_negative(std::max<int64_t>(lo, 0), hi, "", alts);
    if (lo < 0) non_negative(hi < 0 ? -hi : 1, -lo, "\"-\"", alts);
    return define(alternatives(alts));
  }
  // A number x in [lo, hi]: its whole part k with any fraction where that stays inside,
  // the bound itself with a zero fraction.
  const std::string frac = "( \".\" [0-9]{1,16} )?", zero = "( \".\" \"0\"{1,16} )?";
  if (hi >= 0) {
    std::vector<std::string> whole_any;
    if (hi - 1 >= std::max<int64_t>(lo, 0)) non_negative(std::max<int64_t>(lo, 0), hi - 1, "", whole_any);
    if (!whole_any.empty()) alts.push_back(fmt::format("( {} ) {}", alternatives(whole_any), frac));
    if (hi >= lo) alts.push_back(fmt::format("{} {}", gbnf_quote(std::to_string(hi)), zero));
  }
  if (lo < 0) {
    const int64_t kmin = hi >= 0 ? 0 : -hi;
    std::vector<std::string> whole_any;
    if (-lo - 1 >= kmin) non_negative(kmin, -lo - 1, "", whole_any);
    if (!whole_any.empty()) alts.push_back(fmt::format("\"-\" ( {} ) {}", alternatives(whole_any), frac));
    alts.push_back(fmt::format("\"-\" {} {}", gbnf_quote(std::to_string(-lo)), zero));
  }
  return define(alternatives(alts));
}

std::string json_schema_gbnf(const ordered_json& schema, const std::string& path) {
  JsonGrammarWriter writer;
  const std::string value = writer.add(schema, path);
  return "root ::= " + value + "\n" + writer.rules();
}

std::string json_object_gbnf() { return "root ::= json-object\n" + JsonGrammarWriter().rules(); }

}  // namespace kettle::grammar
