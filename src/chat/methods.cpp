// Attribute and item access: dict entries, list/string indexing and slicing,
// and the methods templates call on strings (strip, split, startswith, ...),
// lists (append, pop, ...) and dicts (get, items, ...). The reference's set is
// reproduced; Python methods it lacks (find, count, append, ...) are added.
#include <algorithm>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/text.h"

namespace kettle::jinja {
namespace {

using Method = std::function<Value(CallArgs&)>;

Value method(std::string name, Method m) {
  return Value::function(std::move(name), [m = std::move(m)](CallArgs& args, Interpreter&,
                                                             const std::shared_ptr<Scope>&) { return m(args); });
}

const std::string& string_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view method) {
  const Value* v = a.get(i, name);
  if (!v || !v->is_string()) fault("{}() argument '{}' must be a string", method, name);
  return v->str();
}

// JS `\b\w` title-casing: ASCII letters that start a word are upper-cased,
// the rest is left alone (the reference's `title`).
std::string title_case(const std::string& s) {
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i)
    if (word(out[i]) && (i == 0 || !word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') out[i] = out[i] - 'a' + 'A';
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const char32_t first = next_code_point(s, i);
  std::string head;
  append_utf8(head, first);
  return to_upper(head) + s.substr(i);
}

bool starts_or_ends(const std::string& s, const Value& pattern, bool start, const char* method) {
  auto test = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (pattern.is_string()) return test(pattern.str());
  if (pattern.is_array()) {
    for (const auto& p : pattern.array()) {
      if (!p.is_string()) fault("{}() tuple elements must be strings", method);
      if (test(p.str())) return true;
    }
    return false;
  }
  fault("{}() argument must be a string or tuple of strings", method);
}

Value split(const std::string& s, const CallArgs& a) {
  const Value* sep = a.get(0, "sep");
  const Value* maxv = a.get(1, "maxsplit");
  const int64_t maxsplit = maxv && maxv->is_int() ? maxv->as_int() : -1;
  std::vector<Value> parts;
  if (!sep || sep->is_null() || sep->is_undefined()) {
    // Runs of whitespace separate; no empty strings at the ends.
    const std::string text = js_trim(s, true, false);
    size_t i = 0;
    while (i < text.size()) {
      size_t start = i, n = i;
      while (n < text.size()) {
        size_t next = n;
        if (is_js_space(next_code_point(text, next))) break;
        n = next;
      }
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.emplace_back(text.substr(start));
        break;
      }
      parts.emplace_back(text.substr(start, n - start));
      i = n;
      while (i < text.size()) {
        size_t next = i;
        if (!is_js_space(next_code_point(text, next))) break;
        i = next;
      }
    }
    return Value(std::move(parts));
  }
  if (!sep->is_string()) fault("split() separator must be a string or none");
  const std::string& d = sep->str();
  if (d.empty()) fault("split(): empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      parts.emplace_back(s.substr(start));
      break;
    }
    const size_t at = s.find(d, start);
    if (at == std::string::npos) {
      parts.emplace_back(s.substr(start));
      break;
    }
    parts.emplace_back(s.substr(start, at - start));
    start = at + d.size();
  }
  return Value(std::move(parts));
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    // Python/JS insert `to` at every code point boundary.
    for (size_t i = 0; i <= s.size();) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i == s.size()) break;
      const size_t start = i;
      next_code_point(s, i);
      out.append(s, start, i - start);
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t at = (count < 0 || done < count) ? s.find(from, start) : std::string::npos;
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  return out + s.substr(start);
}

Value strip_method(const std::string& s, const CallArgs& a, bool left, bool right) {
  const Value* chars = a.get(0, "chars");
  // Python semantics for an explicit set of characters; the reference engine
  // ignores the argument and trims all whitespace.
  if (chars && chars->is_string()) return Value(strip_chars(s, chars->str(), left, right));
  return Value(js_trim(s, left, right));
}

int64_t count_of(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(code_point_count(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

int64_t code_point_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(code_point_count(std::string_view(s).substr(0, byte_offset)));
}

template <typename Pred>
bool all_code_points(const std::string& s, Pred p) {
  if (s.empty()) return false;
  for (char32_t cp : to_u32(s))
    if (!p(cp)) return false;
  return true;
}

Value string_member(const std::string& s, const std::string& name) {
  if (name == "length") return Value(static_cast<int64_t>(code_point_count(s)));
  if (name == "upper") return method(name, [s](CallArgs&) { return Value(to_upper(s)); });
  if (name == "lower") return method(name, [s](CallArgs&) { return Value(to_lower(s)); });
  if (name == "title") return method(name, [s](CallArgs&) { return Value(title_case(s)); });
  if (name == "capitalize") return method(name, [s](CallArgs&) { return Value(capitalize(s)); });
  if (name == "strip") return method(name, [s](CallArgs& a) { return strip_method(s, a, true, true); });
  if (name == "lstrip") return method(name, [s](CallArgs& a) { return strip_method(s, a, true, false); });
  if (name == "rstrip") return method(name, [s](CallArgs& a) { return strip_method(s, a, false, true); });
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method(name, [s, start, name](CallArgs& a) {
      if (a.positional.empty()) fault("{}() requires an argument", name);
      return Value(starts_or_ends(s, a.positional[0], start, name.c_str()));
    });
  }
  if (name == "split") return method(name, [s](CallArgs& a) { return split(s, a); });
  if (name == "replace") {
    return method(name, [s](CallArgs& a) {
      const std::string& from = string_arg(a, 0, "old", "replace");
      const std::string& to = string_arg(a, 1, "new", "replace");
      const Value* count = a.get(2, "count");
      if (count && !count->is_int() && !count->is_null()) fault("replace() count must be an integer or none");
      return Value(replace(s, from, to, count && count->is_int() ? count->as_int() : -1));
    });
  }
  if (name == "find" || name == "rfind" || name == "index") {
    return method(name, [s, name](CallArgs& a) {
      const std::string& sub = string_arg(a, 0, "sub", name);
      const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos) {
        if (name == "index") fault("index(): substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(code_point_index(s, at));
    });
  }
  if (name == "count")
    return method(name, [s](CallArgs& a) { return Value(count_of(s, string_arg(a, 0, "sub", "count"))); });
  if (name == "join") {
    return method(name, [s](CallArgs& a) {
      if (a.positional.empty() || !a.positional[0].is_array()) fault("join() argument must be a list");
      std::string out;
      const auto& items = a.positional[0].array();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) fault("join(): item {} is a {}, not a string", i, items[i].type_name());
        if (i) out += s;
        out += items[i].str();
      }
      return Value(std::move(out));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return method(name, [s, prefix, name](CallArgs& a) {
      const std::string& p = string_arg(a, 0, "affix", name);
      if (p.size() <= s.size()) {
        if (prefix && s.compare(0, p.size(), p) == 0) return Value(s.substr(p.size()));
        if (!prefix && s.compare(s.size() - p.size(), p.size(), p) == 0) return Value(s.substr(0, s.size() - p.size()));
      }
      return Value(s);
    });
  }
  if (name == "splitlines") {
    return method(name, [s](CallArgs&) {
      std::vector<Value> lines;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\n' && s[i] != '\r') continue;
        lines.emplace_back(s.substr(start, i - start));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
      if (start < s.size()) lines.emplace_back(s.substr(start));
      return Value(std::move(lines));
    });
  }
  if (name == "isdigit")
    return method(
        name, [s](CallArgs&) { return Value(all_code_points(s, [](char32_t c) { return c >= '0' && c <= '9'; })); });
  if (name == "isspace") return method(name, [s](CallArgs&) { return Value(all_code_points(s, is_js_space)); });
  if (name == "isupper")
    return method(name, [s](CallArgs&) { return Value(!s.empty() && to_upper(s) == s && to_lower(s) != s); });
  if (name == "islower")
    return method(name, [s](CallArgs&) { return Value(!s.empty() && to_lower(s) == s && to_upper(s) != s); });
  return Value();
}

int64_t normalize_index(int64_t i, size_t size, const char* what) {
  const auto n = static_cast<int64_t>(size);
  if (i < 0) i += n;
  if (i < 0 || i >= n) fault("{} index out of range", what);
  return i;
}

Value array_member(const Value& list, const std::string& name) {
  auto& items = list.array();
  if (name == "length") return Value(static_cast<int64_t>(items.size()));
  // Mutating methods act on the shared list, as Python's do.
  if (name == "append") {
    return method(name, [list](CallArgs& a) {
      if (a.positional.size() != 1) fault("append() takes exactly one argument");
      list.array().push_back(a.positional[0]);
      return Value::none();
    });
  }
  if (name == "extend") {
    return method(name, [list](CallArgs& a) {
      if (a.positional.size() != 1 || !a.positional[0].is_array()) fault("extend() takes one list");
      const std::vector<Value> more = a.positional[0].array();
      list.array().insert(list.array().end(), more.begin(), more.end());
      return Value::none();
    });
  }
  if (name == "pop") {
    return method(name, [list](CallArgs& a) {
      auto& v = list.array();
      if (v.empty()) fault("pop from empty list");
      const Value* at = a.get(0, "index");
      const int64_t i = normalize_index(at && at->is_int() ? at->as_int() : -1, v.size(), "pop");
      Value out = v[i];
      v.erase(v.begin() + i);
      return out;
    });
  }
  if (name == "insert") {
    return method(name, [list](CallArgs& a) {
      if (a.positional.size() != 2 || !a.positional[0].is_int()) fault("insert() takes an index and a value");
      auto& v = list.array();
      int64_t i = a.positional[0].as_int();
      const auto n = static_cast<int64_t>(v.size());
      i = i < 0 ? std::max<int64_t>(0, i + n) : std::min(i, n);
      v.insert(v.begin() + i, a.positional[1]);
      return Value::none();
    });
  }
  if (name == "index" || name == "count") {
    return method(name, [list, name](CallArgs& a) {
      if (a.positional.empty()) fault("{}() takes one argument", name);
      int64_t n = 0;
      const auto& v = list.array();
      for (size_t i = 0; i < v.size(); ++i) {
        if (!loose_equals(v[i], a.positional[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") fault("index(): value is not in the list");
      return Value(n);
    });
  }
  return Value();
}

Value dictsort(const Value& obj, const CallArgs& a);

Value object_member(const Value& obj, const std::string& name) {
  if (name == "get") {
    return method(name, [obj](CallArgs& a) {
      if (a.positional.empty() || !a.positional[0].is_string()) fault("dict key must be a string");
      const Value* v = obj.object_data().find(a.positional[0].str());
      if (v) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return method(name, [obj, name](CallArgs&) {
      std::vector<Value> out;
      for (const auto& [k, v] : obj.object_data().entries) {
        if (name == "items")
          out.emplace_back(std::vector<Value>{Value(k), v});
        else
          out.push_back(name == "keys" ? Value(k) : v);
      }
      return Value(std::move(out));
    });
  }
  if (name == "dictsort") return method(name, [obj](CallArgs& a) { return dictsort(obj, a); });
  if (name == "pop") {
    return method(name, [obj](CallArgs& a) {
      if (a.positional.empty() || !a.positional[0].is_string()) fault("dict key must be a string");
      const std::string& key = a.positional[0].str();
      const Value* v = obj.object_data().find(key);
      if (!v) {
        if (a.positional.size() > 1) return a.positional[1];
        fault("key '{}' is not in the dict", key);
      }
      Value out = *v;
      obj.object_data().erase(key);
      return out;
    });
  }
  if (name == "update") {
    return method(name, [obj](CallArgs& a) {
      for (const auto& src : a.positional) {
        if (!src.is_object()) fault("update() takes a dict");
        for (const auto& [k, v] : src.object_data().entries) obj.object_data().set(k, v);
      }
      for (const auto& [k, v] : a.kwargs) obj.object_data().set(k, v);
      return Value::none();
    });
  }
  return Value();
}

Value dictsort(const Value& obj, const CallArgs& a) {
  const Value* cs = a.get(0, "case_sensitive");
  const Value* by = a.get(1, "by");
  const Value* rev = a.get(2, "reverse");
  if (cs && !cs->is_bool()) fault("case_sensitive must be a boolean");
  if (by && (!by->is_string() || (by->str() != "key" && by->str() != "value"))) fault("by must be 'key' or 'value'");
  if (rev && !rev->is_bool()) fault("reverse must be a boolean");
  const size_t index = by && by->str() == "value" ? 1 : 0;
  std::vector<Value> items;
  for (const auto& [k, v] : obj.object_data().entries) items.emplace_back(std::vector<Value>{Value(k), v});
  const bool case_sensitive = cs && cs->as_bool(), reverse = rev && rev->as_bool();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare_values(x.array()[index], y.array()[index], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value(std::move(items));
}

}  // namespace

Value get_member(const Value& object, const Value& key) {
  if (object.is_mapping_like()) {
    if (!key.is_string()) fault("cannot access a dict with a {} key", key.type_name());
    if (const Value* v = object.object_data().find(key.str())) return *v;
    return object.is_object() ? object_member(object, key.str()) : Value();
  }
  if (object.is_array() || object.is_string()) {
    if (key.is_int()) {
      if (object.is_array()) {
        const auto& items = object.array();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        return i >= 0 && i < static_cast<int64_t>(items.size()) ? items[i] : Value();
      }
      const std::u32string cps = to_u32(object.str());
      int64_t i = key.as_int();
      if (i < 0) i += static_cast<int64_t>(cps.size());
      return i >= 0 && i < static_cast<int64_t>(cps.size()) ? Value(from_u32(cps.substr(i, 1))) : Value();
    }
    if (key.is_string())
      return object.is_array() ? array_member(object, key.str()) : string_member(object.str(), key.str());
    fault("cannot index a {} with a {}", object.type_name(), key.type_name());
  }
  if (!key.is_string()) fault("cannot access a {} with a {} key", object.type_name(), key.type_name());
  return Value();
}

Value slice_value(const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (!object.is_array() && !object.is_string())
    fault("only lists and strings can be sliced, not {}", object.type_name());
  for (const Value* b : {&start_v, &stop_v, &step_v})
    if (!b->is_int() && !b->is_undefined()) fault("slice bounds must be integers");
  const int64_t step = step_v.is_int() ? step_v.as_int() : 1;
  if (step == 0) fault("slice step cannot be zero");
  std::u32string cps;
  if (object.is_string()) cps = to_u32(object.str());
  const auto len = static_cast<int64_t>(object.is_array() ? object.array().size() : cps.size());
  int64_t start = 0, stop = 0;
  // Bounds clamp as in the reference's utils.slice.
  if (step > 0) {
    start = start_v.is_int() ? start_v.as_int() : 0;
    start = start < 0 ? std::max<int64_t>(len + start, 0) : std::min(start, len);
    stop = stop_v.is_int() ? stop_v.as_int() : len;
    stop = stop < 0 ? std::max<int64_t>(len + stop, 0) : std::min(stop, len);
  } else {
    start = start_v.is_int() ? start_v.as_int() : len - 1;
    start = start < 0 ? std::max<int64_t>(len + start, -1) : std::min(start, len - 1);
    stop = stop_v.is_int() ? stop_v.as_int() : -1;
    stop = stop < -1 ? std::max<int64_t>(len + stop, -1) : std::min(stop, len - 1);
  }
  const int64_t dir = step > 0 ? 1 : -1;
  if (object.is_array()) {
    std::vector<Value> out;
    for (int64_t i = start; dir * i < dir * stop; i += step) out.push_back(object.array()[i]);
    return Value(std::move(out));
  }
  std::u32string out;
  for (int64_t i = start; dir * i < dir * stop; i += step) out += cps[i];
  return Value(from_u32(out));
}

}  // namespace kettle::jinja
