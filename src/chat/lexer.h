// Template source → tokens, with transformers' settings (trim_blocks and
// lstrip_blocks on, one trailing newline dropped, {% generation %} tags
// removed) applied the way @huggingface/jinja applies them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kettle::jinja {

enum class TokenType {
  kText,
  kNumber,
  kString,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a sign not followed by a number
  kComment,
};

struct Token {
  TokenType type;
  std::string value;
  int line;  // 1-based line in the original source
};

// Throws kettle::Error (kInvalidData) naming the line on malformed input.
std::vector<Token> tokenize(std::string_view source);

}  // namespace kettle::jinja
