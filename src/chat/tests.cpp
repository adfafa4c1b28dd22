// The `is test` library: the reference's tests with its type rules (booleans
// are not numbers, dicts are not iterable), plus the Jinja tests it lacks
// (float, ne, divisibleby, in, sameas, comparisons).
#include <cmath>
#include <map>

#include "chat/builtins.h"
#include "chat/text.h"

namespace kettle::jinja {
namespace {

using Test = bool (*)(const Value& v, const CallArgs& a);

const Value& arg0(const CallArgs& a, const char* test) {
  if (a.positional.empty()) {
    static const Value kUndefined;
    (void)test;
    return kUndefined;
  }
  return a.positional[0];
}

bool t_odd(const Value& v, const CallArgs&) {
  if (!v.is_int()) fault("cannot apply the test 'odd' to a {}", v.type_name());
  return v.as_int() % 2 != 0;
}

bool t_even(const Value& v, const CallArgs&) {
  if (!v.is_int()) fault("cannot apply the test 'even' to a {}", v.type_name());
  return v.as_int() % 2 == 0;
}

bool t_lower(const Value& v, const CallArgs&) {
  return v.is_string() && to_lower(v.str()) == v.str();
}
bool t_upper(const Value& v, const CallArgs&) {
  return v.is_string() && to_upper(v.str()) == v.str();
}
bool t_eq(const Value& v, const CallArgs& a) {
  return strict_equals(v, arg0(a, "eq"));
}
bool t_ne(const Value& v, const CallArgs& a) {
  return !strict_equals(v, arg0(a, "ne"));
}

bool t_divisibleby(const Value& v, const CallArgs& a) {
  const Value& n = arg0(a, "divisibleby");
  if (!v.is_number() || !n.is_number()) fault("divisibleby needs numbers");
  if (n.as_number() == 0) fault("divisibleby zero");
  return std::fmod(v.as_number(), n.as_number()) == 0;
}

bool t_in(const Value& v, const CallArgs& a) {
  const Value& seq = arg0(a, "in");
  if (seq.is_array()) {
    for (const auto& x : seq.array())
      if (strict_equals(x, v)) return true;
    return false;
  }
  if (seq.is_string() && v.is_string()) return seq.str().find(v.str()) != std::string::npos;
  if (seq.is_mapping_like() && v.is_string()) return seq.object_data().find(v.str()) != nullptr;
  fault("cannot test membership in a {}", seq.type_name());
}

bool t_sameas(const Value& v, const CallArgs& a) {
  const Value& other = arg0(a, "sameas");
  if (v.identity() || other.identity()) return v.identity() == other.identity();
  return v.kind() == other.kind() && strict_equals(v, other);
}

template <int kOp>
bool t_compare(const Value& v, const CallArgs& a) {
  const int c = compare_values(v, arg0(a, "comparison"), true);
  return kOp == 0 ? c > 0 : kOp == 1 ? c >= 0 : kOp == 2 ? c < 0 : c <= 0;
}

const std::map<std::string, Test, std::less<>>& tests() {
  static const std::map<std::string, Test, std::less<>> kTests = {
      {"boolean", [](const Value& v, const CallArgs&) { return v.is_bool(); }},
      {"callable", [](const Value& v, const CallArgs&) { return v.is_function(); }},
      {"defined", [](const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const CallArgs&) { return v.is_null(); }},
      {"true", [](const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"string", [](const Value& v, const CallArgs&) { return v.is_string(); }},
      {"number", [](const Value& v, const CallArgs&) { return v.is_number(); }},
      {"integer", [](const Value& v, const CallArgs&) { return v.is_int(); }},
      {"float", [](const Value& v, const CallArgs&) { return v.is_float(); }},
      {"iterable", [](const Value& v, const CallArgs&) { return v.is_array() || v.is_string(); }},
      {"mapping", [](const Value& v, const CallArgs&) { return v.is_object(); }},
      {"sequence", [](const Value& v, const CallArgs&) { return v.is_array() || v.is_object() || v.is_string(); }},
      {"escaped", [](const Value&, const CallArgs&) { return false; }},
      {"odd", t_odd},
      {"even", t_even},
      {"lower", t_lower},
      {"upper", t_upper},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"divisibleby", t_divisibleby},
      {"in", t_in},
      {"sameas", t_sameas},
      {"gt", t_compare<0>},
      {"greaterthan", t_compare<0>},
      {"ge", t_compare<1>},
      {"lt", t_compare<2>},
      {"lessthan", t_compare<2>},
      {"le", t_compare<3>},
  };
  return kTests;
}

}  // namespace

bool has_test(std::string_view name) {
  return tests().count(name) > 0;
}

bool apply_test(const std::string& name, const Value& operand, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fault("unknown test '{}'", name);
  return it->second(operand, args);
}

}  // namespace kettle::jinja
