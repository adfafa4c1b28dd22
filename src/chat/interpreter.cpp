// Statement execution and expression evaluation for chat templates. Where
// @huggingface/jinja returns a result, kettle returns the same one; where it
// fails on valid Jinja (`~` with undefined, string repetition, iterating a
// string), kettle follows Python Jinja instead. One deliberate difference:
// output written before {% break %}/{% continue %} is kept, as in Jinja.
#include "chat/interpreter.h"

#include <cmath>

#include "chat/builtins.h"
#include "chat/text.h"

namespace kettle::jinja {
namespace {

[[noreturn]] void render_error(int line, const std::string& message) {
  throw LocatedFault{line, message};
}

void append_display(std::string& out, const Value& v) {
  if (!v.is_null() && !v.is_undefined()) out += display(v);
}

bool is_numeric_like(const Value& v) {
  return v.is_number() || v.is_bool();
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.array().begin(), seq.array().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& l, const Value& r) {
  const bool is_float = l.is_float() || r.is_float();
  const double a = l.as_number(), b = r.as_number();
  if (op == "+" || op == "-" || op == "*") {
    if (!is_float) {
      const int64_t x = l.as_int(), y = r.as_int();
      return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
    }
    return Value(op == "+" ? a + b : op == "-" ? a - b : a * b);
  }
  if (op == "/" || op == "//" || op == "%") {
    if (b == 0) fault("division by zero");
    if (op == "/") return Value(a / b);
    if (op == "//") {
      const double q = std::floor(a / b);
      return is_float ? Value(q) : Value(static_cast<int64_t>(q));
    }
    // JavaScript's remainder takes the dividend's sign, as the reference does.
    return is_float ? Value(std::fmod(a, b)) : Value(l.as_int() % r.as_int());
  }
  if (op == "<") return Value(a < b);
  if (op == ">") return Value(a > b);
  if (op == "<=") return Value(a <= b);
  if (op == ">=") return Value(a >= b);
  return Value();
}

Value power(const Value& l, const Value& r) {
  const double a = l.as_number(), b = r.as_number();
  if (a == 0 && b < 0) fault("0.0 cannot be raised to a negative power");
  const double result = std::pow(a, b);
  if (!std::isfinite(result)) fault("exponentiation result is not a finite real number");
  if (l.is_float() || r.is_float() || b < 0) return Value(result);
  return Value(static_cast<int64_t>(result));
}

}  // namespace

Value Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value();
}

std::string Interpreter::render(const Body& body, std::shared_ptr<Scope> globals) {
  std::string out;
  const Flow flow = exec_block(body, globals, out);
  if (flow != Flow::kNormal) throw LocatedFault{0, "break/continue outside a loop"};
  return out;
}

Interpreter::Flow Interpreter::exec_block(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out) {
  for (const auto& s : body) {
    const Flow flow = exec(*s, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  switch (s.type) {
    case Stmt::Type::kText:
      out += static_cast<const TextStmt&>(s).text;
      break;
    case Stmt::Type::kOutput:
      append_display(out, eval(*static_cast<const OutputStmt&>(s).expr, scope));
      break;
    case Stmt::Type::kIf: {
      const auto& st = static_cast<const IfStmt&>(s);
      return exec_block(eval(*st.test, scope).truthy() ? st.body : st.alternate, scope, out);
    }
    case Stmt::Type::kFor:
      exec_for(static_cast<const ForStmt&>(s), scope, out);
      break;
    case Stmt::Type::kSet:
      exec_set(static_cast<const SetStmt&>(s), scope);
      break;
    case Stmt::Type::kMacro: {
      const auto& st = static_cast<const MacroStmt&>(s);
      const Callable* callable = &st.callable;
      const std::string name = st.name;
      // Macros see the caller's scope, as in the reference engine.
      scope->set(name, Value::function(name, [callable, name](CallArgs& args, Interpreter& interp,
                                                              const std::shared_ptr<Scope>& caller_scope) {
                   return interp.call_callable(*callable, name, args, caller_scope);
                 }));
      break;
    }
    case Stmt::Type::kCallBlock:
      exec_call_block(static_cast<const CallBlockStmt&>(s), scope, out);
      break;
    case Stmt::Type::kFilterBlock: {
      const auto& st = static_cast<const FilterBlockStmt&>(s);
      std::string body;
      const Flow flow = exec_block(st.body, scope, body);
      if (flow != Flow::kNormal) return flow;
      try {
        CallArgs args = eval_args(st.filter->args, scope);
        append_display(out, apply_filter(st.filter->name, Value(std::move(body)), args, *this, scope));
      } catch (const RenderFault& f) {
        render_error(s.line, f.message);
      }
      break;
    }
    case Stmt::Type::kBreak:
      return Flow::kBreak;
    case Stmt::Type::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const ForStmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  auto loop_scope = std::make_shared<Scope>(scope);
  const Value iterable = eval(*s.iterable, loop_scope);
  std::vector<Value> items;
  if (iterable.is_array()) {
    items = iterable.array();
  } else if (iterable.is_object()) {
    for (const auto& [k, v] : iterable.object_data().entries) items.emplace_back(k);
  } else if (iterable.is_string()) {
    for (char32_t cp : to_u32(iterable.str())) items.emplace_back(from_u32(std::u32string(1, cp)));
  } else if (!iterable.is_undefined()) {
    render_error(s.line, fmt::format("expected a list or dict in the for loop, got {}", iterable.type_name()));
  }

  auto assign = [&](Scope& target, const Value& item) {
    if (!s.unpack) {
      target.set(s.targets[0], item);
      return;
    }
    if (!item.is_array()) render_error(s.line, fmt::format("cannot unpack {}", item.type_name()));
    const auto& parts = item.array();
    if (parts.size() != s.targets.size())
      render_error(s.line, fmt::format("too {} items to unpack", s.targets.size() > parts.size() ? "few" : "many"));
    for (size_t k = 0; k < parts.size(); ++k) target.set(s.targets[k], parts[k]);
  };

  if (s.filter) {
    std::vector<Value> kept;
    for (const auto& item : items) {
      auto test_scope = std::make_shared<Scope>(loop_scope);
      assign(*test_scope, item);
      if (eval(*s.filter, test_scope).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }

  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Value loop = Value::object();
    auto& e = loop.object_data().entries;
    e.emplace_back("index", Value(i + 1));
    e.emplace_back("index0", Value(i));
    e.emplace_back("revindex", Value(n - i));
    e.emplace_back("revindex0", Value(n - i - 1));
    e.emplace_back("first", Value(i == 0));
    e.emplace_back("last", Value(i == n - 1));
    e.emplace_back("length", Value(n));
    e.emplace_back("previtem", i > 0 ? items[i - 1] : Value());
    e.emplace_back("nextitem", i < n - 1 ? items[i + 1] : Value());
    e.emplace_back("depth", Value(1));
    e.emplace_back("depth0", Value(0));
    e.emplace_back("cycle", Value::function("cycle", [i](CallArgs& args, Interpreter&, const std::shared_ptr<Scope>&) {
                     if (args.positional.empty()) fault("loop.cycle() needs at least one argument");
                     return args.positional[static_cast<size_t>(i) % args.positional.size()];
                   }));
    loop_scope->set("loop", std::move(loop));
    assign(*loop_scope, items[i]);
    if (exec_block(s.body, loop_scope, out) == Flow::kBreak) break;
  }
  if (items.empty()) exec_block(s.else_body, loop_scope, out);
}

void Interpreter::exec_set(const SetStmt& s, const std::shared_ptr<Scope>& scope) {
  Value value;
  if (s.value) {
    value = eval(*s.value, scope);
  } else {
    std::string body;
    exec_block(s.body, scope, body);
    value = Value(std::move(body));
  }
  const Expr& target = *s.target;
  if (target.type == Expr::Type::kIdentifier) {
    scope->set(static_cast<const Identifier&>(target).name, std::move(value));
  } else if (target.type == Expr::Type::kList) {
    const auto& names = static_cast<const ListExpr&>(target).items;
    if (!value.is_array()) render_error(s.line, fmt::format("cannot unpack {} in set", value.type_name()));
    const auto& parts = value.array();
    if (parts.size() != names.size())
      render_error(s.line, fmt::format("too {} items to unpack in set", names.size() > parts.size() ? "few" : "many"));
    for (size_t k = 0; k < names.size(); ++k) scope->set(static_cast<const Identifier&>(*names[k]).name, parts[k]);
  } else {
    const auto& member = static_cast<const MemberExpr&>(target);
    const Value object = eval(*member.object, scope);
    if (!object.is_namespace()) render_error(s.line, "cannot assign an attribute of something that is not a namespace");
    const auto& key = static_cast<const Literal&>(*member.property).value;
    if (!key.is_string()) render_error(s.line, "cannot assign to a numeric attribute");
    object.object_data().set(key.str(), std::move(value));
  }
}

Value Interpreter::call_callable(const Callable& c, const std::string& name, CallArgs& args,
                                 std::shared_ptr<Scope> parent) {
  if (call_depth_ >= kMaxCallDepth) fault("macro '{}' recursed more than {} calls deep", name, kMaxCallDepth);
  ++call_depth_;
  struct Unwind {
    int& depth;
    ~Unwind() { --depth; }
  } unwind{call_depth_};
  auto scope = std::make_shared<Scope>(std::move(parent));
  std::vector<std::pair<std::string, Value>> kwargs = std::move(args.kwargs);
  std::vector<const Param*> pending_defaults;
  for (size_t i = 0; i < c.params.size(); ++i) {
    const Param& p = c.params[i];
    Value v;
    bool given = i < args.positional.size();
    if (given) {
      v = args.positional[i];
    } else {
      for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
        if (it->first == p.name) {
          v = std::move(it->second);
          kwargs.erase(it);
          given = true;
          break;
        }
      }
    }
    if (!given && p.default_value) pending_defaults.push_back(&p);
    scope->set(p.name, std::move(v));
  }
  if (c.uses_kwargs) {
    Value kw = Value::object();
    kw.object_data().entries = std::move(kwargs);
    scope->set("kwargs", std::move(kw));
  } else if (!kwargs.empty()) {
    fault("macro '{}' takes no keyword argument '{}'", name, kwargs.front().first);
  }
  if (c.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = c.params.size(); i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    scope->set("varargs", Value(std::move(rest)));
  } else if (args.positional.size() > c.params.size()) {
    fault("macro '{}' takes not more than {} argument(s)", name, c.params.size());
  }
  for (const Param* p : pending_defaults) scope->set(p->name, eval(*p->default_value, scope));
  std::string out;
  exec_block(c.body, scope, out);
  return Value(std::move(out));
}

void Interpreter::exec_call_block(const CallBlockStmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  const Callable* caller_body = &s.caller;
  Value caller = Value::function(
      "caller", [caller_body, scope](CallArgs& args, Interpreter& interp, const std::shared_ptr<Scope>&) {
        return interp.call_callable(*caller_body, "caller", args, scope);
      });
  CallArgs args = eval_args(s.call->args, scope);
  const Value fn = eval(*s.call->callee, scope);
  auto call_scope = std::make_shared<Scope>(scope);
  call_scope->set("caller", std::move(caller));
  try {
    append_display(out, call(fn, args, call_scope));
  } catch (const RenderFault& f) {
    render_error(s.line, f.message);
  }
}

CallArgs Interpreter::eval_args(const std::vector<Arg>& args, const std::shared_ptr<Scope>& scope) {
  CallArgs out;
  for (const auto& a : args) {
    if (a.kind == Arg::Kind::kPositional) {
      out.positional.push_back(eval(*a.value, scope));
    } else if (a.kind == Arg::Kind::kSpread) {
      const Value v = eval(*a.value, scope);
      if (!v.is_array()) render_error(a.value->line, fmt::format("cannot unpack {} with *", v.type_name()));
      out.positional.insert(out.positional.end(), v.array().begin(), v.array().end());
    }
  }
  auto add = [&](const std::string& key, Value v, int line) {
    if (out.kwarg(key)) render_error(line, fmt::format("got multiple values for keyword argument '{}'", key));
    out.kwargs.emplace_back(key, std::move(v));
  };
  for (const auto& a : args) {
    if (a.kind == Arg::Kind::kKeyword) {
      add(a.name, eval(*a.value, scope), a.value->line);
    } else if (a.kind == Arg::Kind::kKeywordSpread) {
      const Value v = eval(*a.value, scope);
      if (!v.is_object())
        render_error(a.value->line, fmt::format("argument after ** must be a dict, not {}", v.type_name()));
      for (const auto& [k, e] : v.object_data().entries) add(k, e, a.value->line);
    }
  }
  return out;
}

Value Interpreter::call(const Value& fn, CallArgs& args, const std::shared_ptr<Scope>& scope) {
  if (!fn.is_function()) fault("cannot call something that is not a function: got {}", fn.type_name());
  return fn.function_data().fn(args, *this, scope);
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  try {
    return eval_inner(e, scope);
  } catch (const RenderFault& f) {
    render_error(e.line, f.message);
  }
}

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope) {
  switch (e.type) {
    case Expr::Type::kLiteral:
      return static_cast<const Literal&>(e).value;
    case Expr::Type::kIdentifier:
      return scope->lookup(static_cast<const Identifier&>(e).name);
    case Expr::Type::kList: {
      std::vector<Value> items;
      for (const auto& item : static_cast<const ListExpr&>(e).items) items.push_back(eval(*item, scope));
      return Value(std::move(items));
    }
    case Expr::Type::kDict: {
      Value obj = Value::object();
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        const Value key = eval(*k, scope);
        if (!key.is_string()) fault("dict keys must be strings: got {}", key.type_name());
        obj.object_data().set(key.str(), eval(*v, scope));
      }
      return obj;
    }
    case Expr::Type::kMember:
      return eval_member(static_cast<const MemberExpr&>(e), scope);
    case Expr::Type::kSlice:
      fault("a slice is only valid inside []");
    case Expr::Type::kCall: {
      const auto& c = static_cast<const CallExpr&>(e);
      CallArgs args = eval_args(c.args, scope);
      return call(eval(*c.callee, scope), args, scope);
    }
    case Expr::Type::kUnary:
      return eval_unary(static_cast<const UnaryExpr&>(e), scope);
    case Expr::Type::kBinary:
      return eval_binary(static_cast<const BinaryExpr&>(e), scope);
    case Expr::Type::kFilter: {
      const auto& f = static_cast<const FilterExpr&>(e);
      const Value operand = eval(*f.operand, scope);
      CallArgs args = eval_args(f.args, scope);
      return apply_filter(f.name, operand, args, *this, scope);
    }
    case Expr::Type::kTest: {
      const auto& t = static_cast<const TestExpr&>(e);
      const Value operand = eval(*t.operand, scope);
      const CallArgs args = eval_args(t.args, scope);
      return Value(apply_test(t.name, operand, args) != t.negate);
    }
    case Expr::Type::kSelect: {
      const auto& s = static_cast<const SelectExpr&>(e);
      return eval(*s.test, scope).truthy() ? eval(*s.value, scope) : Value();
    }
    case Expr::Type::kTernary: {
      const auto& t = static_cast<const TernaryExpr&>(e);
      return eval(*t.cond, scope).truthy() ? eval(*t.yes, scope) : eval(*t.no, scope);
    }
  }
  return Value();
}

Value Interpreter::eval_member(const MemberExpr& e, const std::shared_ptr<Scope>& scope) {
  const Value object = eval(*e.object, scope);
  if (e.computed && e.property->type == Expr::Type::kSlice) {
    const auto& s = static_cast<const SliceExpr&>(*e.property);
    auto bound = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value(); };
    return slice_value(object, bound(s.start), bound(s.stop), bound(s.step));
  }
  const Value key = e.computed ? eval(*e.property, scope) : static_cast<const Literal&>(*e.property).value;
  return get_member(object, key);
}

Value Interpreter::eval_unary(const UnaryExpr& e, const std::shared_ptr<Scope>& scope) {
  const Value v = eval(*e.operand, scope);
  if (e.op == "not") return Value(!v.truthy());
  const int sign = e.op == "-" ? -1 : 1;
  if (v.is_float()) return Value(sign * v.as_float());
  if (v.is_int()) return Value(sign * v.as_int());
  if (v.is_bool()) return Value(static_cast<int64_t>(sign * (v.as_bool() ? 1 : 0)));
  fault("unary {} cannot apply to {}", e.op, v.type_name());
}

Value Interpreter::eval_binary(const BinaryExpr& e, const std::shared_ptr<Scope>& scope) {
  const std::string& op = e.op;
  const Value l = eval(*e.left, scope);
  if (op == "and") return l.truthy() ? eval(*e.right, scope) : l;
  if (op == "or") return l.truthy() ? l : eval(*e.right, scope);
  const Value r = eval(*e.right, scope);
  if (op == "==") return Value(loose_equals(l, r));
  if (op == "!=") return Value(!loose_equals(l, r));
  const bool membership = op == "in" || op == "not in";
  if (l.is_undefined() || r.is_undefined()) {
    if (r.is_undefined() && membership) return Value(op == "not in");
    if (op == "~") return Value(raw_string(l) + raw_string(r));  // Jinja prints undefined as ""
    fault("cannot apply '{}' to undefined values", op);
  }
  if (l.is_null() || r.is_null()) fault("cannot apply '{}' to none", op);
  if (op == "~") return Value(raw_string(l) + raw_string(r));
  if (op == "**" && is_numeric_like(l) && is_numeric_like(r)) return power(l, r);
  if (l.is_number() && r.is_number()) {
    Value v = arithmetic(op, l, r);
    if (!v.is_undefined()) return v;
  } else if (l.is_array() && r.is_array()) {
    if (op == "+") {
      std::vector<Value> items = l.array();
      items.insert(items.end(), r.array().begin(), r.array().end());
      return Value(std::move(items));
    }
  } else if (r.is_array() && membership) {
    bool found = false;
    for (const auto& item : r.array()) found = found || strict_equals(item, l);
    return Value(found == (op == "in"));
  }
  if ((l.is_string() || r.is_string()) && op == "+") return Value(raw_string(l) + raw_string(r));
  if (l.is_string() && r.is_string()) {
    if (membership) return Value((r.str().find(l.str()) != std::string::npos) == (op == "in"));
    if (op == "<") return Value(l.str() < r.str());
    if (op == ">") return Value(l.str() > r.str());
    if (op == "<=") return Value(l.str() <= r.str());
    if (op == ">=") return Value(l.str() >= r.str());
  }
  if (l.is_string() && r.is_object() && membership)
    return Value((r.object_data().find(l.str()) != nullptr) == (op == "in"));
  if (op == "*" && (l.is_string() || l.is_array()) && r.is_int()) return repeat(l, r.as_int());
  if (op == "*" && (r.is_string() || r.is_array()) && l.is_int()) return repeat(r, l.as_int());
  fault("unknown operator '{}' between {} and {}", op, l.type_name(), r.type_name());
}

}  // namespace kettle::jinja
