// Renders a parsed chat template: scopes, statements and expressions, with
// @huggingface/jinja's semantics (its undefined handling, its operators, its
// dynamic macro scope) so prompts come out byte-identical.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "chat/ast.h"
#include "chat/value.h"

namespace kettle::jinja {

struct Scope {
  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value value) { vars[name] = std::move(value); }

  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

class Interpreter {
 public:
  // Runs `body` with `globals` as the outermost scope. Throws LocatedFault on
  // a render error, or kettle::Error with the template's raise_exception
  // message verbatim.
  std::string render(const Body& body, std::shared_ptr<Scope> globals);

  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value call(const Value& fn, CallArgs& args, const std::shared_ptr<Scope>& scope);
  CallArgs eval_args(const std::vector<Arg>& args, const std::shared_ptr<Scope>& scope);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_block(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void exec_for(const ForStmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  void exec_set(const SetStmt& s, const std::shared_ptr<Scope>& scope);
  void exec_call_block(const CallBlockStmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  Value call_callable(const Callable& c, const std::string& name, CallArgs& args, std::shared_ptr<Scope> parent);

  // Macro calls nest at most this deep: a template that recurses without end fails
  // with a message instead of overflowing the stack.
  static constexpr int kMaxCallDepth = 200;
  int call_depth_ = 0;

  Value eval_inner(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_member(const MemberExpr& e, const std::shared_ptr<Scope>& scope);
  Value eval_binary(const BinaryExpr& e, const std::shared_ptr<Scope>& scope);
  Value eval_unary(const UnaryExpr& e, const std::shared_ptr<Scope>& scope);
};

}  // namespace kettle::jinja
