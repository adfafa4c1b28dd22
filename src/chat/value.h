// The runtime value of the chat-template interpreter: undefined, none, bool,
// int, float, string, list, dict, namespace and callable. Lists, dicts and
// namespaces are shared references, as in Python and @huggingface/jinja.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kettle::jinja {

class Value;
class Interpreter;
struct Scope;

// A value-level failure (wrong type, bad argument). The evaluator attaches the
// template line number and turns it into a kettle::Error.
struct RenderFault {
  std::string message;
};
// A render failure already pinned to a template line; ChatTemplate adds the
// template's origin and turns it into a kettle::Error.
struct LocatedFault {
  int line;
  std::string message;
};
template <typename... Args>
[[noreturn]] void fault(fmt::format_string<Args...> format, Args&&... args);

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> kwargs;

  const Value* kwarg(std::string_view name) const;
  // positional[index], else kwargs[name], else nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

using NativeFn = std::function<Value(CallArgs& args, Interpreter& interp, const std::shared_ptr<Scope>& scope)>;

enum class Kind : uint8_t { kUndefined, kNull, kBool, kInt, kFloat, kString, kArray, kObject, kNamespace, kFunction };

struct ObjectData;
struct FunctionData {
  std::string name;
  NativeFn fn;
};

class Value {
 public:
  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::kBool), b_(b) {}
  Value(int v) : kind_(Kind::kInt), i_(v) {}
  Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
  Value(double v) : kind_(Kind::kFloat), f_(v) {}
  Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::kString), s_(s) {}
  Value(std::vector<Value> items);
  static Value none();
  static Value object();  // empty dict
  static Value make_namespace();
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_mapping_like() const { return kind_ == Kind::kObject || kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return f_; }
  double as_number() const;  // int, float or bool as a double
  const std::string& str() const { return s_; }
  std::vector<Value>& array() const { return *arr_; }
  ObjectData& object_data() const { return *obj_; }
  const FunctionData& function_data() const { return *fn_; }
  // Identity of a shared container (lists/dicts compare by reference in the reference engine).
  const void* identity() const;

  bool truthy() const;
  const char* type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> arr_;
  std::shared_ptr<ObjectData> obj_;
  std::shared_ptr<FunctionData> fn_;
};

// A dict keeps insertion order (Python dicts; JSON input order).
struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
  bool erase(std::string_view key);
};

// JSON input → value. Integral numbers become ints, as JavaScript's JSON does.
Value from_json(const nlohmann::ordered_json& j);

struct JsonOptions {
  int indent = -1;  // < 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // empty: default
  std::string key_separator;
  bool has_separators = false;
};
// `tojson` (and the printed form of lists/dicts): Python json.dumps layout,
// JSON.stringify scalars. undefined_as_null=false prints "undefined" as the
// reference does when a list is printed.
std::string to_json(const Value& v, const JsonOptions& options, bool undefined_as_null = true);

// What `{{ v }}` prints (the reference's toString).
std::string display(const Value& v);
// JavaScript's String(v.value): what `~` and string `+` concatenate.
std::string raw_string(const Value& v);
// `==` (JavaScript loose equality of the underlying values).
bool loose_equals(const Value& a, const Value& b);
// `in` on lists and `unique` (strict equality of the underlying values).
bool strict_equals(const Value& a, const Value& b);
// Ordering for sort/dictsort/min/max: numbers (and bools) with numbers, strings with strings.
int compare_values(const Value& a, const Value& b, bool case_sensitive);

template <typename... Args>
[[noreturn]] void fault(fmt::format_string<Args...> format, Args&&... args) {
  throw RenderFault{fmt::format(format, std::forward<Args>(args)...)};
}

}  // namespace kettle::jinja
