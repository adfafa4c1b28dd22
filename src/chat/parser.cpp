// Recursive-descent parser for chat templates. The grammar mirrors
// @huggingface/jinja's parser so precedence quirks render the same; Jinja's
// test arguments (`is divisibleby 3`) and `{% raw %}` are additions.
#include "chat/parser.h"

#include <algorithm>
#include <array>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "chat/syntax_error.h"

namespace kettle::jinja {
namespace {

constexpr std::array<std::string_view, 11> kUnsupportedStatements = {
    "include", "import", "from", "extends", "block", "with", "autoescape", "do", "trans", "pluralize", "print"};

const char* token_name(TokenType t) {
  switch (t) {
    case TokenType::kText:
      return "text";
    case TokenType::kNumber:
      return "number";
    case TokenType::kString:
      return "string";
    case TokenType::kIdentifier:
      return "name";
    case TokenType::kEquals:
      return "'='";
    case TokenType::kOpenParen:
      return "'('";
    case TokenType::kCloseParen:
      return "')'";
    case TokenType::kOpenStatement:
      return "'{%'";
    case TokenType::kCloseStatement:
      return "'%}'";
    case TokenType::kOpenExpression:
      return "'{{'";
    case TokenType::kCloseExpression:
      return "'}}'";
    case TokenType::kOpenBracket:
      return "'['";
    case TokenType::kCloseBracket:
      return "']'";
    case TokenType::kOpenBrace:
      return "'{'";
    case TokenType::kCloseBrace:
      return "'}'";
    case TokenType::kComma:
      return "','";
    case TokenType::kDot:
      return "'.'";
    case TokenType::kColon:
      return "':'";
    case TokenType::kPipe:
      return "'|'";
    case TokenType::kAdditive:
      return "operator";
    case TokenType::kMultiplicative:
      return "operator";
    case TokenType::kPower:
      return "'**'";
    case TokenType::kComparison:
      return "comparison";
    case TokenType::kUnary:
      return "sign";
    case TokenType::kComment:
      return "comment";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body run() {
    Body body;
    while (pos_ < tokens_.size()) append(body, parse_any());
    return body;
  }

 private:
  // ---- token access -------------------------------------------------------
  bool at_end(size_t k = 0) const { return pos_ + k >= tokens_.size(); }
  const Token& peek(size_t k = 0) const {
    static const Token kEnd{TokenType::kComment, "<end of template>", 0};
    return at_end(k) ? kEnd : tokens_[pos_ + k];
  }
  int line() const {
    if (!at_end()) return tokens_[pos_].line;
    return tokens_.empty() ? 1 : tokens_.back().line;
  }
  bool is(TokenType t, size_t k = 0) const { return !at_end(k) && tokens_[pos_ + k].type == t; }
  bool is_name(std::string_view name, size_t k = 0) const {
    return is(TokenType::kIdentifier, k) && peek(k).value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(TokenType::kOpenStatement) || !is(TokenType::kIdentifier, 1)) return false;
    return std::find(names.begin(), names.end(), peek(1).value) != names.end();
  }
  const Token& expect(TokenType t, std::string_view what) {
    if (at_end()) syntax_error(line(), "expected {} but the template ended", what);
    if (tokens_[pos_].type != t)
      syntax_error(line(), "expected {}, got {} '{}'", what, token_name(tokens_[pos_].type), tokens_[pos_].value);
    return tokens_[pos_++];
  }
  void expect_name(std::string_view name) {
    if (!is_name(name)) syntax_error(line(), "expected '{}', got '{}'", name, peek().value);
    ++pos_;
  }
  void expect_end_tag(std::string_view name) {
    expect(TokenType::kOpenStatement, fmt::format("'{{% {} %}}'", name));
    expect_name(name);
    expect(TokenType::kCloseStatement, "'%}'");
  }
  // Body statements until one of `names` opens; errors if the template ends first.
  Body parse_until(std::initializer_list<std::string_view> names, int opened_at, std::string_view what) {
    Body body;
    while (!is_statement(names)) {
      if (at_end()) syntax_error(opened_at, "'{}' is never closed", what);
      append(body, parse_any());
    }
    return body;
  }
  static void append(Body& body, StmtPtr s) {
    if (s) body.push_back(std::move(s));
  }

  // ---- statements ---------------------------------------------------------
  StmtPtr parse_any() {
    const Token& t = peek();
    switch (t.type) {
      case TokenType::kComment:
        ++pos_;
        return nullptr;
      case TokenType::kText:
        ++pos_;
        return std::make_unique<TextStmt>(t.line, t.value);
      case TokenType::kOpenStatement:
        return parse_statement();
      case TokenType::kOpenExpression: {
        ++pos_;
        auto e = parse_expression();
        expect(TokenType::kCloseExpression, "'}}'");
        return std::make_unique<OutputStmt>(e->line, std::move(e));
      }
      default:
        syntax_error(t.line, "unexpected {} '{}'", token_name(t.type), t.value);
    }
  }

  StmtPtr parse_statement() {
    expect(TokenType::kOpenStatement, "'{%'");
    const int at = line();
    if (!is(TokenType::kIdentifier)) syntax_error(at, "expected a statement name after '{{%'");
    const std::string name = tokens_[pos_++].value;
    if (name == "set") return parse_set(at);
    if (name == "if") {
      auto s = parse_if(at);
      expect_end_tag("endif");
      return s;
    }
    if (name == "for") return parse_for(at);
    if (name == "macro") return parse_macro(at);
    if (name == "call") return parse_call_block(at);
    if (name == "filter") return parse_filter_block(at);
    if (name == "break" || name == "continue") {
      expect(TokenType::kCloseStatement, "'%}'");
      return std::make_unique<LoopControlStmt>(at, name == "break" ? Stmt::Type::kBreak : Stmt::Type::kContinue);
    }
    if (std::find(kUnsupportedStatements.begin(), kUnsupportedStatements.end(), name) != kUnsupportedStatements.end())
      unsupported(at, "the '{{% {} %}}' statement", name);
    syntax_error(at, "unknown or misplaced statement '{{% {} %}}'", name);
  }

  StmtPtr parse_set(int at) {
    auto s = std::make_unique<SetStmt>(at);
    s->target = parse_expression_sequence(false);
    check_assign_target(*s->target);
    if (is(TokenType::kEquals)) {
      ++pos_;
      s->value = parse_expression_sequence(false);
    } else {
      expect(TokenType::kCloseStatement, "'=' or '%}'");
      s->body = parse_until({"endset"}, at, "set");
      expect(TokenType::kOpenStatement, "'{%'");
      expect_name("endset");
    }
    expect(TokenType::kCloseStatement, "'%}'");
    return s;
  }

  void check_assign_target(const Expr& e) const {
    if (e.type == Expr::Type::kIdentifier) return;
    if (e.type == Expr::Type::kMember && !static_cast<const MemberExpr&>(e).computed) return;
    if (e.type == Expr::Type::kList && static_cast<const ListExpr&>(e).tuple) {
      for (const auto& item : static_cast<const ListExpr&>(e).items)
        if (item->type != Expr::Type::kIdentifier) syntax_error(e.line, "can only unpack into plain names");
      return;
    }
    syntax_error(e.line, "cannot assign to this expression");
  }

  std::unique_ptr<IfStmt> parse_if(int at) {
    auto s = std::make_unique<IfStmt>(at, parse_expression());
    expect(TokenType::kCloseStatement, "'%}'");
    s->body = parse_until({"elif", "else", "endif"}, at, "if");
    if (is_statement({"elif"})) {
      pos_ += 2;
      s->alternate.push_back(parse_if(line()));
    } else if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "'%}'");
      s->alternate = parse_until({"endif"}, at, "if");
    }
    return s;
  }

  StmtPtr parse_for(int at) {
    auto s = std::make_unique<ForStmt>(at);
    auto target = parse_expression_sequence(true);
    if (target->type == Expr::Type::kIdentifier) {
      s->targets.push_back(static_cast<Identifier&>(*target).name);
    } else if (target->type == Expr::Type::kList && static_cast<ListExpr&>(*target).tuple) {
      s->unpack = true;
      for (auto& item : static_cast<ListExpr&>(*target).items) {
        if (item->type != Expr::Type::kIdentifier) syntax_error(at, "loop variables must be plain names");
        s->targets.push_back(static_cast<Identifier&>(*item).name);
      }
    } else {
      syntax_error(at, "expected a name or a tuple of names after 'for'");
    }
    if (!is_name("in")) syntax_error(line(), "expected 'in' after the loop variable");
    ++pos_;
    auto iterable = parse_expression();
    if (iterable->type == Expr::Type::kSelect) {
      auto& sel = static_cast<SelectExpr&>(*iterable);
      s->iterable = std::move(sel.value);
      s->filter = std::move(sel.test);
    } else {
      s->iterable = std::move(iterable);
    }
    expect(TokenType::kCloseStatement, "'%}'");
    s->body = parse_until({"endfor", "else"}, at, "for");
    if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "'%}'");
      s->else_body = parse_until({"endfor"}, at, "for");
    }
    expect_end_tag("endfor");
    return s;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    for (auto& arg : parse_args()) {
      if (arg.kind == Arg::Kind::kKeyword) {
        params.push_back({arg.name, std::move(arg.value)});
      } else if (arg.kind == Arg::Kind::kPositional && arg.value->type == Expr::Type::kIdentifier) {
        if (!params.empty() && params.back().default_value)
          syntax_error(arg.value->line, "a parameter without default follows one with a default");
        params.push_back({static_cast<Identifier&>(*arg.value).name, nullptr});
      } else {
        syntax_error(line(), "expected a parameter name");
      }
      for (size_t i = 0; i + 1 < params.size(); ++i)
        if (params[i].name == params.back().name) syntax_error(line(), "duplicate parameter '{}'", params.back().name);
    }
    return params;
  }

  void parse_callable_body(Callable& c, int at, std::string_view end_name) {
    callables_.push_back(&c);
    c.body = parse_until({end_name}, at, end_name.substr(3));
    callables_.pop_back();
    expect_end_tag(end_name);
  }

  StmtPtr parse_macro(int at) {
    auto s = std::make_unique<MacroStmt>(at);
    if (!is(TokenType::kIdentifier)) syntax_error(at, "expected the macro name");
    s->name = tokens_[pos_++].value;
    if (!is(TokenType::kOpenParen)) syntax_error(at, "expected '(' after the macro name");
    s->callable.params = parse_params();
    expect(TokenType::kCloseStatement, "'%}'");
    parse_callable_body(s->callable, at, "endmacro");
    return s;
  }

  StmtPtr parse_call_block(int at) {
    auto s = std::make_unique<CallBlockStmt>(at);
    if (is(TokenType::kOpenParen)) s->caller.params = parse_params();
    if (!is(TokenType::kIdentifier)) syntax_error(at, "expected a macro name after 'call'");
    auto callee = std::make_unique<Identifier>(line(), tokens_[pos_++].value);
    s->call = std::make_unique<CallExpr>(at, std::move(callee));
    s->call->args = parse_args();
    expect(TokenType::kCloseStatement, "'%}'");
    parse_callable_body(s->caller, at, "endcall");
    return s;
  }

  StmtPtr parse_filter_block(int at) {
    auto s = std::make_unique<FilterBlockStmt>(at);
    s->filter = parse_filter_call(nullptr);
    expect(TokenType::kCloseStatement, "'%}'");
    s->body = parse_until({"endfilter"}, at, "filter");
    expect_end_tag("endfilter");
    return s;
  }

  // ---- expressions --------------------------------------------------------
  ExprPtr parse_expression_sequence(bool primary) {
    const int at = line();
    auto first = primary ? parse_primary() : parse_expression();
    if (!is(TokenType::kComma)) return first;
    auto tuple = std::make_unique<ListExpr>(at, true);
    tuple->items.push_back(std::move(first));
    while (is(TokenType::kComma)) {
      ++pos_;
      tuple->items.push_back(primary ? parse_primary() : parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression() { return parse_if_expression(); }

  ExprPtr parse_if_expression() {
    auto a = parse_or();
    if (!is_name("if")) return a;
    const int at = line();
    ++pos_;
    auto test = parse_or();
    if (is_name("else")) {
      ++pos_;
      auto no = parse_if_expression();
      return std::make_unique<TernaryExpr>(at, std::move(test), std::move(a), std::move(no));
    }
    return std::make_unique<SelectExpr>(at, std::move(a), std::move(test));
  }

  ExprPtr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      const int at = line();
      ++pos_;
      left = std::make_unique<BinaryExpr>(at, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      const int at = line();
      ++pos_;
      left = std::make_unique<BinaryExpr>(at, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int at = line();
      ++pos_;
      return std::make_unique<UnaryExpr>(at, "not", parse_not());
    }
    return parse_comparison();
  }

  ExprPtr parse_comparison() {
    auto left = parse_additive();
    while (true) {
      const int at = line();
      std::string op;
      if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is(TokenType::kComparison)) {
        op = tokens_[pos_++].value;
      } else {
        return left;
      }
      left = std::make_unique<BinaryExpr>(at, op, std::move(left), parse_additive());
    }
  }

  ExprPtr parse_additive() {
    auto left = parse_multiplicative();
    while (is(TokenType::kAdditive)) {
      const int at = line();
      const std::string op = tokens_[pos_++].value;
      left = std::make_unique<BinaryExpr>(at, op, std::move(left), parse_multiplicative());
    }
    return left;
  }

  ExprPtr parse_multiplicative() {
    auto left = parse_power();
    while (is(TokenType::kMultiplicative)) {
      const int at = line();
      const std::string op = tokens_[pos_++].value;
      left = std::make_unique<BinaryExpr>(at, op, std::move(left), parse_power());
    }
    return left;
  }

  ExprPtr parse_power() {
    auto left = parse_test();
    while (is(TokenType::kPower)) {
      const int at = line();
      ++pos_;
      left = std::make_unique<BinaryExpr>(at, "**", std::move(left), parse_test());
    }
    return left;
  }

  // Can the token start a test's single bare argument (`is divisibleby 3`)?
  bool starts_test_argument() const {
    if (is(TokenType::kNumber) || is(TokenType::kString) || is(TokenType::kOpenBracket) || is(TokenType::kOpenBrace))
      return true;
    if (!is(TokenType::kIdentifier)) return false;
    static constexpr std::array<std::string_view, 7> kStop = {"else", "or", "and", "if", "in", "is", "not"};
    return std::find(kStop.begin(), kStop.end(), peek().value) == kStop.end();
  }

  ExprPtr parse_test() {
    auto operand = parse_filter();
    while (is_name("is")) {
      const int at = line();
      ++pos_;
      const bool negate = is_name("not");
      if (negate) ++pos_;
      if (!is(TokenType::kIdentifier)) syntax_error(at, "expected a test name after 'is'");
      std::string name = tokens_[pos_++].value;
      if (!has_test(name)) unsupported(at, "the test '{}'", name);
      auto test = std::make_unique<TestExpr>(at, std::move(operand), std::move(name), negate);
      if (is(TokenType::kOpenParen)) {
        test->args = parse_args();
      } else if (starts_test_argument()) {
        Arg arg;
        arg.value = parse_member(parse_primary());
        test->args.push_back(std::move(arg));
      }
      operand = std::move(test);
    }
    return operand;
  }

  std::unique_ptr<FilterExpr> parse_filter_call(ExprPtr operand) {
    const int at = line();
    if (!is(TokenType::kIdentifier)) syntax_error(at, "expected a filter name");
    std::string name = tokens_[pos_++].value;
    if (!has_filter(name)) unsupported(at, "the filter '{}'", name);
    auto f = std::make_unique<FilterExpr>(at, std::move(operand), std::move(name));
    if (is(TokenType::kOpenParen)) f->args = parse_args();
    return f;
  }

  ExprPtr parse_filter() {
    auto operand = parse_sign();
    while (is(TokenType::kPipe)) {
      ++pos_;
      operand = parse_filter_call(std::move(operand));
    }
    return operand;
  }

  ExprPtr parse_sign() {
    if ((is(TokenType::kUnary) || is(TokenType::kAdditive)) && (peek().value == "-" || peek().value == "+")) {
      const int at = line();
      const std::string op = tokens_[pos_++].value;
      return std::make_unique<UnaryExpr>(at, op, parse_sign());
    }
    return parse_call_member();
  }

  ExprPtr parse_call_member() {
    auto member = parse_member(parse_primary());
    while (is(TokenType::kOpenParen)) {
      auto call = std::make_unique<CallExpr>(line(), std::move(member));
      call->args = parse_args();
      member = parse_member(std::move(call));
    }
    return member;
  }

  std::vector<Arg> parse_args() {
    expect(TokenType::kOpenParen, "'('");
    std::vector<Arg> args;
    bool saw_keyword = false;
    while (!is(TokenType::kCloseParen)) {
      if (at_end()) syntax_error(line(), "argument list is never closed with ')'");
      Arg arg;
      if (is(TokenType::kPower)) {
        ++pos_;
        arg.kind = Arg::Kind::kKeywordSpread;
        arg.value = parse_expression();
      } else if (is(TokenType::kMultiplicative) && peek().value == "*") {
        ++pos_;
        arg.kind = Arg::Kind::kSpread;
        arg.value = parse_expression();
      } else {
        arg.value = parse_expression();
        if (is(TokenType::kEquals)) {
          ++pos_;
          if (arg.value->type != Expr::Type::kIdentifier) syntax_error(line(), "expected a name before '='");
          arg.kind = Arg::Kind::kKeyword;
          arg.name = static_cast<Identifier&>(*arg.value).name;
          arg.value = parse_expression();
          saw_keyword = true;
        } else if (saw_keyword) {
          syntax_error(line(), "positional argument follows keyword argument");
        }
      }
      args.push_back(std::move(arg));
      if (is(TokenType::kComma)) ++pos_;
    }
    ++pos_;
    return args;
  }

  ExprPtr parse_subscript() {
    // [expr], [a:b], [a:b:c], [::-1]
    const int at = line();
    std::vector<ExprPtr> parts;
    bool slice = false;
    while (!is(TokenType::kCloseBracket)) {
      if (at_end()) syntax_error(at, "'[' is never closed");
      if (is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++pos_;
        slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(TokenType::kColon)) {
          ++pos_;
          slice = true;
        }
      }
    }
    if (parts.empty()) syntax_error(at, "empty subscript '[]'");
    if (!slice) {
      if (parts.size() > 1) syntax_error(at, "expected ']'");
      return std::move(parts[0]);
    }
    if (parts.size() > 3) syntax_error(at, "a slice takes at most 3 parts");
    auto s = std::make_unique<SliceExpr>(at);
    parts.resize(3);
    s->start = std::move(parts[0]);
    s->stop = std::move(parts[1]);
    s->step = std::move(parts[2]);
    return s;
  }

  ExprPtr parse_member(ExprPtr object) {
    while (is(TokenType::kDot) || is(TokenType::kOpenBracket)) {
      const int at = line();
      const bool computed = is(TokenType::kOpenBracket);
      ++pos_;
      ExprPtr property;
      if (computed) {
        property = parse_subscript();
        expect(TokenType::kCloseBracket, "']'");
      } else if (is(TokenType::kIdentifier)) {
        property = std::make_unique<Literal>(at, Value(tokens_[pos_++].value));
      } else if (is(TokenType::kNumber) && peek().value.find('.') == std::string::npos) {
        property = std::make_unique<Literal>(at, Value(static_cast<int64_t>(std::stoll(tokens_[pos_++].value))));
      } else {
        syntax_error(at, "expected a name after '.'");
      }
      object = std::make_unique<MemberExpr>(at, std::move(object), std::move(property), computed);
    }
    return object;
  }

  ExprPtr parse_primary() {
    if (at_end()) syntax_error(line(), "expected an expression but the template ended");
    const Token& t = tokens_[pos_++];
    switch (t.type) {
      case TokenType::kNumber:
        if (t.value.find('.') != std::string::npos) return std::make_unique<Literal>(t.line, Value(std::stod(t.value)));
        try {
          return std::make_unique<Literal>(t.line, Value(static_cast<int64_t>(std::stoll(t.value))));
        } catch (const std::out_of_range&) {
          return std::make_unique<Literal>(t.line, Value(std::stod(t.value)));
        }
      case TokenType::kString: {
        std::string s = t.value;
        while (is(TokenType::kString)) s += tokens_[pos_++].value;  // adjacent literals concatenate
        return std::make_unique<Literal>(t.line, Value(std::move(s)));
      }
      case TokenType::kIdentifier:
        if ((t.value == "kwargs" || t.value == "varargs") && !callables_.empty())
          (t.value == "kwargs" ? callables_.back()->uses_kwargs : callables_.back()->uses_varargs) = true;
        return std::make_unique<Identifier>(t.line, t.value);
      case TokenType::kOpenParen: {
        auto e = parse_expression_sequence(false);
        expect(TokenType::kCloseParen, "')'");
        return e;
      }
      case TokenType::kOpenBracket: {
        auto list = std::make_unique<ListExpr>(t.line, false);
        while (!is(TokenType::kCloseBracket)) {
          if (at_end()) syntax_error(t.line, "'[' is never closed");
          list->items.push_back(parse_expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return list;
      }
      case TokenType::kOpenBrace: {
        auto dict = std::make_unique<DictExpr>(t.line);
        while (!is(TokenType::kCloseBrace)) {
          if (at_end()) syntax_error(t.line, "'{{' is never closed");
          auto key = parse_expression();
          expect(TokenType::kColon, "':' between key and value");
          dict->items.emplace_back(std::move(key), parse_expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return dict;
      }
      default:
        syntax_error(t.line, "unexpected {} '{}'", token_name(t.type), t.value);
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::vector<Callable*> callables_;  // macros/call blocks being parsed (kwargs/varargs use)
};

}  // namespace

Body parse_template(std::string_view source) {
  return Parser(tokenize(source)).run();
}

}  // namespace kettle::jinja
