// Global names every chat template sees: true/false/none (and the Title-case
// spellings), range, namespace, dict, raise_exception and strftime_now, as
// transformers and @huggingface/jinja provide them.
#include <ctime>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "util/error.h"

namespace kettle::jinja {
namespace {

Value native(const char* name, Value (*fn)(CallArgs&)) {
  return Value::function(name, [fn](CallArgs& a, Interpreter&, const std::shared_ptr<Scope>&) { return fn(a); });
}

Value range(CallArgs& a) {
  for (const auto& v : a.positional)
    if (!v.is_int()) fault("range() arguments must be integers, got {}", v.type_name());
  if (a.positional.empty() || a.positional.size() > 3) fault("range() takes 1 to 3 arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  }
  if (step == 0) fault("range() step must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return Value(std::move(out));
}

Value make_namespace(CallArgs& a) {
  if (a.positional.size() > 1) fault("namespace() takes at most 1 positional argument, got {}", a.positional.size());
  Value ns = Value::make_namespace();
  auto& data = ns.object_data();
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.is_object()) {
      for (const auto& [k, v] : src.object_data().entries) data.set(k, v);
    } else if (src.is_array()) {
      for (const auto& pair : src.array()) {
        if (!pair.is_array() || pair.array().size() != 2 || !pair.array()[0].is_string())
          fault("namespace() expects a dict or a list of [key, value] pairs");
        data.set(pair.array()[0].str(), pair.array()[1]);
      }
    } else {
      fault("'{}' object is not iterable", src.type_name());
    }
  }
  for (const auto& [k, v] : a.kwargs) data.set(k, v);
  return ns;
}

Value make_dict(CallArgs& a) {
  Value d = Value::object();
  for (const auto& src : a.positional) {
    if (!src.is_object()) fault("dict() takes a dict or keyword arguments");
    for (const auto& [k, v] : src.object_data().entries) d.object_data().set(k, v);
  }
  for (const auto& [k, v] : a.kwargs) d.object_data().set(k, v);
  return d;
}

Value raise_exception(CallArgs& a) {
  // The template's own message, verbatim: it is addressed to the caller.
  fail(ErrorCategory::kInvalidArgument, "{}", a.positional.empty() ? std::string() : raw_string(a.positional[0]));
}

// transformers' strftime_now: local time. The reference prints %b/%B with
// English month names; other directives go through the C library (Python's).
Value strftime_now(CallArgs& a) {
  if (a.positional.empty() || !a.positional[0].is_string()) fault("strftime_now() needs a format string");
  const std::string& format = a.positional[0].str();
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  static const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                  "July",    "August",   "September", "October", "November", "December"};
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char d = format[++i];
    switch (d) {
      case 'Y':
        out += std::to_string(tm.tm_year + 1900);
        break;
      case 'm':
        out += fmt::format("{:02}", tm.tm_mon + 1);
        break;
      case 'd':
        out += fmt::format("{:02}", tm.tm_mday);
        break;
      case 'H':
        out += fmt::format("{:02}", tm.tm_hour);
        break;
      case 'M':
        out += fmt::format("{:02}", tm.tm_min);
        break;
      case 'b':
        out += std::string(kMonths[tm.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[tm.tm_mon];
        break;
      case '%':
        out += '%';
        break;
      default: {
        char buf[128];
        const char spec[3] = {'%', d, '\0'};
        const size_t n = std::strftime(buf, sizeof buf, spec, &tm);
        out.append(buf, n);
      }
    }
  }
  return Value(std::move(out));
}

}  // namespace

void install_globals(Scope& scope) {
  scope.set("true", Value(true));
  scope.set("false", Value(false));
  scope.set("none", Value::none());
  scope.set("True", Value(true));
  scope.set("False", Value(false));
  scope.set("None", Value::none());
  scope.set("range", native("range", range));
  scope.set("namespace", native("namespace", make_namespace));
  scope.set("dict", native("dict", make_dict));
  scope.set("raise_exception", native("raise_exception", raise_exception));
  scope.set("strftime_now", native("strftime_now", strftime_now));
}

}  // namespace kettle::jinja
