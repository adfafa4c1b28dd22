// Value construction, truthiness, printing, JSON serialisation, equality and
// ordering, reproducing @huggingface/jinja's runtime (what chat prompts show).
#include "chat/value.h"

#include <algorithm>
#include <cmath>

#include "chat/text.h"

namespace kettle::jinja {

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return kwarg(name);
}

Value::Value(std::vector<Value> items)
    : kind_(Kind::kArray), arr_(std::make_shared<std::vector<Value>>(std::move(items))) {}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNull;
  return v;
}

Value Value::object() {
  Value v;
  v.kind_ = Kind::kObject;
  v.obj_ = std::make_shared<ObjectData>();
  return v;
}

Value Value::make_namespace() {
  Value v = object();
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<FunctionData>(FunctionData{std::move(name), std::move(fn)});
  return v;
}

double Value::as_number() const {
  switch (kind_) {
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kFloat:
      return f_;
    case Kind::kBool:
      return b_ ? 1 : 0;
    default:
      return 0;
  }
}

const void* Value::identity() const {
  if (arr_) return arr_.get();
  if (obj_) return obj_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0 && !std::isnan(f_);
    case Kind::kString:
      return !s_.empty();
    case Kind::kArray:
      return !arr_->empty();
    case Kind::kObject:
      return !obj_->entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNull:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "callable";
  }
  return "?";
}

const Value* ObjectData::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void ObjectData::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

bool ObjectData::erase(std::string_view key) {
  auto it = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
  if (it == entries.end()) return false;
  entries.erase(it);
  return true;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      // JavaScript has one number type: 3.0 in the input is the integer 3.
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
      return Value(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value obj = Value::object();
      for (const auto& [k, e] : j.items()) obj.object_data().entries.emplace_back(k, from_json(e));
      return obj;
    }
    default:
      return Value();
  }
}

namespace {

void append_hex4(std::string& out, unsigned v) {
  static const char* kHex = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 0xF];
}

// JSON.stringify of a string; with ensure_ascii every code point >= 0x7F is
// escaped as UTF-16 units, as the reference does.
std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      append_hex4(out, cp);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        append_hex4(out, 0xD800 + ((cp - 0x10000) >> 10));
        append_hex4(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        append_hex4(out, cp);
      }
    } else {
      append_utf8(out, cp);
    }
  }
  return out + "\"";
}

// Values nest at most this deep when printed: request JSON is capped far lower
// (server/json_reader.h), and a template-built list that contains itself ends
// here with a message instead of overflowing the stack.
constexpr int kMaxJsonDepth = 256;

void json_into(std::string& out, const Value& v, const JsonOptions& o, int depth, bool undefined_as_null) {
  if (depth > kMaxJsonDepth) throw RenderFault{fmt::format("tojson: a value nested more than {} levels deep", kMaxJsonDepth)};
  const bool indent = o.indent > 0;
  const std::string item_sep = o.has_separators ? o.item_separator : indent ? "," : ", ";
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  const std::string pad = indent ? std::string(o.indent, ' ') : "";
  auto newline = [&](int d) {
    out += '\n';
    for (int k = 0; k < d; ++k) out += pad;
  };
  switch (v.kind()) {
    case Kind::kUndefined:
      out += undefined_as_null ? "null" : "undefined";
      return;
    case Kind::kNull:
      out += "null";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      out += std::isfinite(v.as_float()) ? js_number(v.as_float()) : "null";
      return;
    case Kind::kString:
      out += json_string(v.str(), o.ensure_ascii);
      return;
    case Kind::kArray: {
      const auto& items = v.array();
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent) newline(depth + 1);
        json_into(out, items[i], o, depth + 1, undefined_as_null);
      }
      if (indent && !items.empty()) newline(depth);
      out += ']';
      return;
    }
    case Kind::kObject:
    case Kind::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.object_data().entries) entries.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (indent) newline(depth + 1);
        out += json_string(entries[i]->first, o.ensure_ascii);
        out += key_sep;
        json_into(out, entries[i]->second, o, depth + 1, undefined_as_null);
      }
      if (indent && !entries.empty()) newline(depth);
      out += '}';
      return;
    }
    case Kind::kFunction:
      fault("cannot convert a callable to JSON");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options, bool undefined_as_null) {
  std::string out;
  json_into(out, v, options, 0, undefined_as_null);
  return out;
}

std::string display(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNull:
      return "";
    case Kind::kBool:
      return v.as_bool() ? "true" : "false";
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat: {
      const double d = v.as_float();
      if (d == 0 && std::signbit(d)) return "-0.0";
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e21) return fmt::format("{:.1f}", d);
      return js_number(d);
    }
    case Kind::kString:
      return v.str();
    case Kind::kArray:
    case Kind::kObject:
    case Kind::kNamespace:
      return to_json(v, {}, false);
    case Kind::kFunction:
      return "<function " + v.function_data().name + ">";
  }
  return "";
}

std::string raw_string(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNull:
      return "null";
    case Kind::kFloat:
      return js_number(v.as_float());
    case Kind::kArray: {
      // Array.prototype.toString: the elements' printed forms joined by ",".
      std::string out;
      const auto& items = v.array();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ',';
        out += display(items[i]);
      }
      return out;
    }
    case Kind::kObject:
    case Kind::kNamespace:
      return "[object Map]";
    default:
      return display(v);
  }
}

namespace {

// ToNumber of a JS string (for "1" == 1): trimmed decimal, empty → 0, else NaN.
double js_to_number(const std::string& s) {
  const std::string t = js_trim(s, true, true);
  if (t.empty()) return 0;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() ? d : std::nan("");
}

bool is_numeric_like(const Value& v) {
  return v.is_number() || v.is_bool();
}

}  // namespace

bool loose_equals(const Value& a, const Value& b) {
  const bool a_nullish = a.is_null() || a.is_undefined();
  const bool b_nullish = b.is_null() || b.is_undefined();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (is_numeric_like(a) && is_numeric_like(b)) return a.as_number() == b.as_number();
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_string() && is_numeric_like(b)) return js_to_number(a.str()) == b.as_number();
  if (b.is_string() && is_numeric_like(a)) return js_to_number(b.str()) == a.as_number();
  if (a.kind() == b.kind() && a.identity()) return a.identity() == b.identity();
  return false;
}

bool strict_equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNull:
      return true;
    case Kind::kBool:
      return a.as_bool() == b.as_bool();
    case Kind::kString:
      return a.str() == b.str();
    default:
      return a.identity() == b.identity();
  }
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_null() || b.is_null() || a.is_undefined() || b.is_undefined())
    fault("cannot compare {} with {}", a.type_name(), b.type_name());
  if (is_numeric_like(a) && is_numeric_like(b)) {
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.str() : to_lower(a.str());
    const std::string y = case_sensitive ? b.str() : to_lower(b.str());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  fault("cannot compare {} with {}", a.type_name(), b.type_name());
}

}  // namespace kettle::jinja
