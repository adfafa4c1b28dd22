// The syntax tree of a parsed chat template: expressions and statements, each
// carrying the source line it came from so render errors can name it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace kettle::jinja {

struct Expr {
  enum class Type {
    kLiteral,
    kIdentifier,
    kList,
    kDict,
    kMember,
    kSlice,
    kCall,
    kUnary,
    kBinary,
    kFilter,
    kTest,
    kSelect,
    kTernary
  };
  Expr(Type t, int l) : type(t), line(l) {}
  virtual ~Expr() = default;
  Type type;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Literal : Expr {
  Literal(int l, Value v) : Expr(Type::kLiteral, l), value(std::move(v)) {}
  Value value;
};

struct Identifier : Expr {
  Identifier(int l, std::string n) : Expr(Type::kIdentifier, l), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {  // [a, b] or (a, b)
  ListExpr(int l, bool t) : Expr(Type::kList, l), tuple(t) {}
  std::vector<ExprPtr> items;
  bool tuple;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Type::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct SliceExpr : Expr {  // only as the subscript of a MemberExpr
  explicit SliceExpr(int l) : Expr(Type::kSlice, l) {}
  ExprPtr start, stop, step;
};

struct MemberExpr : Expr {  // a.b, a[b], a[1:2]
  MemberExpr(int l, ExprPtr o, ExprPtr p, bool c)
      : Expr(Type::kMember, l), object(std::move(o)), property(std::move(p)), computed(c) {}
  ExprPtr object;
  ExprPtr property;  // not computed: a Literal string (name) or int
  bool computed;
};

struct Arg {
  enum class Kind { kPositional, kKeyword, kSpread, kKeywordSpread };
  Kind kind = Kind::kPositional;
  std::string name;  // kKeyword
  ExprPtr value;
};

struct CallExpr : Expr {
  CallExpr(int l, ExprPtr c) : Expr(Type::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  std::vector<Arg> args;
};

struct UnaryExpr : Expr {
  UnaryExpr(int l, std::string o, ExprPtr e) : Expr(Type::kUnary, l), op(std::move(o)), operand(std::move(e)) {}
  std::string op;  // not, -, +
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  BinaryExpr(int l, std::string o, ExprPtr a, ExprPtr b)
      : Expr(Type::kBinary, l), op(std::move(o)), left(std::move(a)), right(std::move(b)) {}
  std::string op;
  ExprPtr left, right;
};

struct FilterExpr : Expr {  // operand | name(args)
  FilterExpr(int l, ExprPtr o, std::string n) : Expr(Type::kFilter, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;  // null inside a {% filter %} block
  std::string name;
  std::vector<Arg> args;
};

struct TestExpr : Expr {  // operand is [not] name(args)
  TestExpr(int l, ExprPtr o, std::string n, bool neg)
      : Expr(Type::kTest, l), operand(std::move(o)), name(std::move(n)), negate(neg) {}
  ExprPtr operand;
  std::string name;
  bool negate;
  std::vector<Arg> args;
};

struct SelectExpr : Expr {  // value if test   (undefined when false)
  SelectExpr(int l, ExprPtr v, ExprPtr t) : Expr(Type::kSelect, l), value(std::move(v)), test(std::move(t)) {}
  ExprPtr value, test;
};

struct TernaryExpr : Expr {  // yes if cond else no
  TernaryExpr(int l, ExprPtr c, ExprPtr y, ExprPtr n)
      : Expr(Type::kTernary, l), cond(std::move(c)), yes(std::move(y)), no(std::move(n)) {}
  ExprPtr cond, yes, no;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Type { kText, kOutput, kIf, kFor, kSet, kMacro, kCallBlock, kFilterBlock, kBreak, kContinue };
  Stmt(Type t, int l) : type(t), line(l) {}
  virtual ~Stmt() = default;
  Type type;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(Type::kText, l), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(int l, ExprPtr e) : Stmt(Type::kOutput, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  IfStmt(int l, ExprPtr t) : Stmt(Type::kIf, l), test(std::move(t)) {}
  ExprPtr test;
  Body body, alternate;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Type::kFor, l) {}
  std::vector<std::string> targets;
  bool unpack = false;  // `for a, b in ...`
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`
  Body body, else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Type::kSet, l) {}
  ExprPtr target;  // Identifier, ListExpr of Identifiers, or MemberExpr on a namespace
  ExprPtr value;   // null: block set, the rendered body is the value
  Body body;
};

struct Param {
  std::string name;
  ExprPtr default_value;
};

struct Callable {  // what macros and call blocks share
  std::vector<Param> params;
  Body body;
  bool uses_kwargs = false;
  bool uses_varargs = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Type::kMacro, l) {}
  std::string name;
  Callable callable;
};

struct CallBlockStmt : Stmt {  // {% call(args) macro(...) %}body{% endcall %}
  explicit CallBlockStmt(int l) : Stmt(Type::kCallBlock, l) {}
  std::unique_ptr<CallExpr> call;
  Callable caller;
};

struct FilterBlockStmt : Stmt {  // {% filter name(args) %}body{% endfilter %}
  explicit FilterBlockStmt(int l) : Stmt(Type::kFilterBlock, l) {}
  std::unique_ptr<FilterExpr> filter;
  Body body;
};

struct LoopControlStmt : Stmt {
  LoopControlStmt(int l, Type t) : Stmt(t, l) {}
};

}  // namespace kettle::jinja
