// The `|filter` library. Each filter returns what @huggingface/jinja returns
// for the same input (tojson layout, join of raw values, case-insensitive
// sort, ...); filters or operand types the reference rejects follow Python
// Jinja (default on undefined, map by filter name, select/reject, batch, ...).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/text.h"

namespace kettle::jinja {
namespace {

using Filter = Value (*)(const Value& v, CallArgs& a, Interpreter& interp, const std::shared_ptr<Scope>& scope);

[[noreturn]] void bad_operand(const char* filter, const Value& v) {
  fault("cannot apply the filter '{}' to a {}", filter, v.type_name());
}

bool bool_arg(const CallArgs& a, size_t i, std::string_view name, bool fallback) {
  const Value* v = a.get(i, name);
  if (!v || v->is_undefined()) return fallback;
  if (!v->is_bool()) fault("'{}' must be a boolean", name);
  return v->as_bool();
}

// Dotted attribute paths (`a.b`, `items.0`) as the reference's getAttributeValue.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_mapping_like()) {
      const Value* next = v.object_data().find(part);
      v = next ? *next : Value();
    } else if (v.is_array()) {
      char* end = nullptr;
      const long i = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || i < 0 || i >= static_cast<long>(v.array().size())) return Value();
      v = v.array()[i];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::vector<Value> as_items(const char* filter, const Value& v) {
  if (v.is_array()) return v.array();
  if (v.is_undefined()) return {};
  if (v.is_string()) {
    std::vector<Value> out;
    for (char32_t cp : to_u32(v.str())) out.emplace_back(from_u32(std::u32string(1, cp)));
    return out;
  }
  if (v.is_object()) {
    std::vector<Value> out;
    for (const auto& [k, e] : v.object_data().entries) out.emplace_back(k);
    return out;
  }
  bad_operand(filter, v);
}

Value f_safe(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  return v;
}

Value f_tojson(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  JsonOptions o;
  const Value* indent = a.get(0, "indent");
  if (indent && indent->is_int())
    o.indent = static_cast<int>(indent->as_int());
  else if (indent && !indent->is_null() && !indent->is_undefined())
    fault("tojson: indent must be an integer");
  o.ensure_ascii = bool_arg(a, 99, "ensure_ascii", false);
  o.sort_keys = bool_arg(a, 99, "sort_keys", false);
  if (const Value* sep = a.kwarg("separators"); sep && !sep->is_null()) {
    if (!sep->is_array() || sep->array().size() != 2 || !sep->array()[0].is_string() || !sep->array()[1].is_string())
      fault("tojson: separators must be a tuple of two strings");
    o.has_separators = true;
    o.item_separator = sep->array()[0].str();
    o.key_separator = sep->array()[1].str();
  }
  return Value(to_json(v, o));
}

Value f_default(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* fallback = a.get(0, "default_value");
  const bool boolean = bool_arg(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback ? *fallback : Value("");
  return v;
}

Value f_list(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  if (v.is_array()) return v;
  return Value(as_items("list", v));
}

Value f_first(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  auto items = as_items("first", v);
  return items.empty() ? Value() : items.front();
}

Value f_last(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  auto items = as_items("last", v);
  return items.empty() ? Value() : items.back();
}

Value f_length(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  if (v.is_array()) return Value(static_cast<int64_t>(v.array().size()));
  if (v.is_string()) return Value(static_cast<int64_t>(code_point_count(v.str())));
  if (v.is_object()) return Value(static_cast<int64_t>(v.object_data().entries.size()));
  if (v.is_undefined()) return Value(static_cast<int64_t>(0));
  bad_operand("length", v);
}

Value f_reverse(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  if (v.is_string()) {
    std::u32string s = to_u32(v.str());
    std::reverse(s.begin(), s.end());
    return Value(from_u32(s));
  }
  if (!v.is_array()) bad_operand("reverse", v);
  std::vector<Value> items = v.array();
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value f_sort(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  if (!v.is_array()) bad_operand("sort", v);
  const bool reverse = bool_arg(a, 0, "reverse", false);
  const bool case_sensitive = bool_arg(a, 1, "case_sensitive", false);
  const Value* attr = a.get(2, "attribute");
  std::string path;
  if (attr && attr->is_string())
    path = attr->str();
  else if (attr && attr->is_int())
    path = std::to_string(attr->as_int());
  else if (attr && !attr->is_null() && !attr->is_undefined())
    fault("sort: attribute must be a string or integer");
  auto key = [&](const Value& x) { return path.empty() ? x : attribute_path(x, path); };
  std::vector<Value> items = v.array();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare_values(key(x), key(y), case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value(std::move(items));
}

Value f_join(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* sep_v = a.get(0, "separator");
  if (!sep_v) sep_v = a.kwarg("d");
  if (sep_v && !sep_v->is_string()) fault("join: separator must be a string");
  const std::string sep = sep_v ? sep_v->str() : "";
  const Value* attr = a.get(1, "attribute");
  std::string out;
  const auto items = as_items("join", v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    const Value item = attr && attr->is_string() ? attribute_path(items[i], attr->str()) : items[i];
    // Array.prototype.join prints null and undefined as "".
    if (!item.is_null()) out += raw_string(item);
  }
  return Value(std::move(out));
}

Value f_string(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  return Value(display(v));
}

Value f_unique(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  std::vector<Value> out;
  for (const auto& item : as_items("unique", v)) {
    bool seen = false;
    for (const auto& o : out) seen = seen || strict_equals(o, item);
    if (!seen) out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_map(const Value& v, CallArgs& a, Interpreter& interp, const std::shared_ptr<Scope>& scope) {
  std::vector<Value> out;
  if (const Value* attr = a.kwarg("attribute")) {
    if (!attr->is_string()) fault("map: attribute must be a string");
    const Value* fallback = a.kwarg("default");
    for (const auto& item : as_items("map", v)) {
      if (!item.is_mapping_like()) fault("map: items must be dicts to map an attribute");
      Value x = attribute_path(item, attr->str());
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string()) fault("map needs a filter name or attribute=");
  const std::string name = a.positional[0].str();
  if (!has_filter(name)) fault("map: unknown filter '{}'", name);
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.kwargs = a.kwargs;
  for (const auto& item : as_items("map", v)) {
    CallArgs each = rest;
    out.push_back(apply_filter(name, item, each, interp, scope));
  }
  return Value(std::move(out));
}

// selectattr/rejectattr as the reference: a missing attribute never passes.
Value select_attr(const Value& v, CallArgs& a, bool select) {
  if (a.positional.empty() || !a.positional[0].is_string()) fault("selectattr/rejectattr need an attribute name");
  const std::string& attr = a.positional[0].str();
  std::string test;
  if (a.positional.size() > 1) {
    if (!a.positional[1].is_string()) fault("the test name must be a string");
    test = a.positional[1].str();
    if (!has_test(test)) fault("unknown test '{}'", test);
  }
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + std::min<size_t>(2, a.positional.size()), a.positional.end());
  std::vector<Value> out;
  for (const auto& item : as_items(select ? "selectattr" : "rejectattr", v)) {
    if (!item.is_mapping_like()) fault("selectattr/rejectattr need a list of dicts, got a {} item", item.type_name());
    const Value* x = item.object_data().find(attr);
    const bool pass = x && (test.empty() ? x->truthy() : apply_test(test, *x, test_args));
    if (pass == select) out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_selectattr(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return select_attr(v, a, true);
}
Value f_rejectattr(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return select_attr(v, a, false);
}

Value select_items(const Value& v, CallArgs& a, bool select) {
  std::string test;
  if (!a.positional.empty()) {
    if (!a.positional[0].is_string()) fault("the test name must be a string");
    test = a.positional[0].str();
    if (!has_test(test)) fault("unknown test '{}'", test);
  }
  CallArgs test_args;
  if (a.positional.size() > 1) test_args.positional.assign(a.positional.begin() + 1, a.positional.end());
  std::vector<Value> out;
  for (const auto& item : as_items(select ? "select" : "reject", v)) {
    const bool pass = test.empty() ? item.truthy() : apply_test(test, item, test_args);
    if (pass == select) out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_select(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return select_items(v, a, true);
}
Value f_reject(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return select_items(v, a, false);
}

Value f_items(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  if (v.is_undefined()) return Value(std::vector<Value>{});
  if (!v.is_mapping_like()) bad_operand("items", v);
  std::vector<Value> out;
  for (const auto& [k, e] : v.object_data().entries) out.emplace_back(std::vector<Value>{Value(k), e});
  return Value(std::move(out));
}

Value f_dictsort(const Value& v, CallArgs& a, Interpreter& interp, const std::shared_ptr<Scope>& scope) {
  if (!v.is_object()) bad_operand("dictsort", v);
  return interp.call(get_member(v, Value("dictsort")), a, scope);
}

const std::string& string_operand(const char* filter, const Value& v) {
  if (!v.is_string()) bad_operand(filter, v);
  return v.str();
}

Value f_trim(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const std::string& s = string_operand("trim", v);
  const Value* chars = a.get(0, "chars");
  if (chars && chars->is_string()) return Value(strip_chars(s, chars->str(), true, true));
  return Value(js_trim(s, true, true));
}

Value string_method(const char* name, const Value& v, CallArgs& a, Interpreter& interp,
                    const std::shared_ptr<Scope>& scope) {
  string_operand(name, v);
  return interp.call(get_member(v, Value(name)), a, scope);
}

Value f_upper(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  return Value(to_upper(string_operand("upper", v)));
}
Value f_lower(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  return Value(to_lower(string_operand("lower", v)));
}
Value f_title(const Value& v, CallArgs&, Interpreter& i, const std::shared_ptr<Scope>& s) {
  CallArgs none;
  return string_method("title", v, none, i, s);
}
Value f_capitalize(const Value& v, CallArgs&, Interpreter& i, const std::shared_ptr<Scope>& s) {
  CallArgs none;
  return string_method("capitalize", v, none, i, s);
}
Value f_replace(const Value& v, CallArgs& a, Interpreter& i, const std::shared_ptr<Scope>& s) {
  return string_method("replace", v, a, i, s);
}

Value f_indent(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const std::string& s = string_operand("indent", v);
  const Value* width = a.get(0, "width");
  std::string pad(4, ' ');
  if (width && width->is_int())
    pad = std::string(static_cast<size_t>(std::max<int64_t>(0, width->as_int())), ' ');
  else if (width && width->is_string())
    pad = width->str();
  else if (width)
    fault("indent: width must be a number");
  const bool first = a.get(1, "first") && a.get(1, "first")->truthy();
  const bool blank = a.get(2, "blank") && a.get(2, "blank")->truthy();
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const std::string part = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (line > 0) out += '\n';
    if (!((!first && line == 0) || (!blank && part.empty()))) out += pad;
    out += part;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return Value(std::move(out));
}

// JavaScript parseInt / parseFloat: the longest numeric prefix, else NaN.
bool parse_prefix(const std::string& s, bool integer, double* out) {
  const std::string t = js_trim(s, true, false);
  const char* begin = t.c_str();
  char* end = nullptr;
  const double d = integer ? static_cast<double>(std::strtoll(begin, &end, 10)) : std::strtod(begin, &end);
  if (end == begin || std::isnan(d)) return false;
  *out = d;
  return true;
}

Value f_int(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* fallback = a.get(0, "default");
  if (v.is_int()) return v;
  if (v.is_float()) return Value(static_cast<int64_t>(std::floor(v.as_float())));
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool() ? 1 : 0));
  double d = 0;
  if (v.is_string() && parse_prefix(v.str(), true, &d)) return Value(static_cast<int64_t>(d));
  return fallback ? *fallback : Value(static_cast<int64_t>(0));
}

Value f_float(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* fallback = a.get(0, "default");
  if (v.is_number()) return Value(v.as_number());
  if (v.is_bool()) return Value(v.as_bool() ? 1.0 : 0.0);
  double d = 0;
  if (v.is_string() && parse_prefix(v.str(), false, &d)) return Value(d);
  return fallback ? *fallback : Value(0.0);
}

Value f_bool(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  return Value(v.truthy());
}

Value f_abs(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  bad_operand("abs", v);
}

Value f_round(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  if (!v.is_number()) bad_operand("round", v);
  const Value* p = a.get(0, "precision");
  const Value* m = a.get(1, "method");
  const double scale = std::pow(10.0, p && p->is_int() ? static_cast<double>(p->as_int()) : 0.0);
  const std::string method = m && m->is_string() ? m->str() : "common";
  const double x = v.as_number() * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
  return Value(r / scale);
}

Value f_escape(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  std::string out;
  for (char c : display(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value(std::move(out));
}

Value extreme(const Value& v, CallArgs& a, bool want_max) {
  const auto items = as_items(want_max ? "max" : "min", v);
  if (items.empty()) return Value();
  const bool case_sensitive = bool_arg(a, 0, "case_sensitive", false);
  const Value* attr = a.get(1, "attribute");
  auto key = [&](const Value& x) { return attr && attr->is_string() ? attribute_path(x, attr->str()) : x; };
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare_values(key(items[i]), key(best), case_sensitive);
    if (want_max ? c > 0 : c < 0) best = items[i];
  }
  return best;
}

Value f_min(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return extreme(v, a, false);
}
Value f_max(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  return extreme(v, a, true);
}

Value f_sum(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* attr = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  Value total = start ? *start : Value(static_cast<int64_t>(0));
  for (const auto& item : as_items("sum", v)) {
    const Value x = attr && attr->is_string() ? attribute_path(item, attr->str()) : item;
    if (!x.is_number() || !total.is_number()) fault("sum: items must be numbers");
    total =
        total.is_int() && x.is_int() ? Value(total.as_int() + x.as_int()) : Value(total.as_number() + x.as_number());
  }
  return total;
}

Value f_batch(const Value& v, CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) {
  const Value* n = a.get(0, "linecount");
  if (!n || !n->is_int() || n->as_int() <= 0) fault("batch: linecount must be a positive integer");
  const Value* fill = a.get(1, "fill_with");
  std::vector<Value> out, cur;
  for (const auto& item : as_items("batch", v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n->as_int()) out.emplace_back(std::exchange(cur, {}));
  }
  if (!cur.empty()) {
    if (fill && !fill->is_undefined())
      while (static_cast<int64_t>(cur.size()) < n->as_int()) cur.push_back(*fill);
    out.emplace_back(std::move(cur));
  }
  return Value(std::move(out));
}

Value f_wordcount(const Value& v, CallArgs&, Interpreter&, const std::shared_ptr<Scope>&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t cp : to_u32(string_operand("wordcount", v))) {
    const bool w = !is_js_space(cp);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::map<std::string, Filter, std::less<>>& filters() {
  static const std::map<std::string, Filter, std::less<>> kFilters = {
      {"abs", f_abs},
      {"batch", f_batch},
      {"bool", f_bool},
      {"capitalize", f_capitalize},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return kFilters;
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) > 0;
}

Value apply_filter(const std::string& name, const Value& operand, CallArgs& args, Interpreter& interp,
                   const std::shared_ptr<Scope>& scope) {
  auto it = filters().find(name);
  if (it == filters().end()) fault("unknown filter '{}'", name);
  return it->second(operand, args, interp, scope);
}

}  // namespace kettle::jinja
