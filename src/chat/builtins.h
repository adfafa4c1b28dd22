// The interpreter's library: filters (filters.cpp), tests (tests.cpp),
// attributes and methods of strings, lists and dicts (methods.cpp) and the
// global functions (globals.cpp).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "chat/value.h"

namespace kettle::jinja {

class Interpreter;
struct Scope;

bool has_filter(std::string_view name);
Value apply_filter(const std::string& name, const Value& operand, CallArgs& args, Interpreter& interp,
                   const std::shared_ptr<Scope>& scope);

bool has_test(std::string_view name);
bool apply_test(const std::string& name, const Value& operand, const CallArgs& args);

// obj.key / obj[key]: dict entries, list/string indexing, bound methods.
Value get_member(const Value& object, const Value& key);
// obj[start:stop:step] with undefined bounds for the omitted parts.
Value slice_value(const Value& object, const Value& start, const Value& stop, const Value& step);

// true/false/none, range, namespace, dict, raise_exception, strftime_now.
void install_globals(Scope& scope);

}  // namespace kettle::jinja
