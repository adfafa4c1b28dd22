// Tokeniser for the chat-template Jinja subset. The whitespace rules are text
// rewrites before tokenising, exactly as @huggingface/jinja does them (its
// regexes are reproduced by hand), with every byte remembering its source line.
#include "chat/lexer.h"

#include <array>
#include <utility>

#include "chat/syntax_error.h"
#include "chat/text.h"

namespace kettle::jinja {
namespace {

// Source text with the original line of each byte, so errors after rewriting
// still name the line the author sees.
struct Source {
  std::string text;
  std::vector<int> lines;

  void push(char c, int line) {
    text += c;
    lines.push_back(line);
  }
  void append(const Source& s, size_t from, size_t to) {
    text.append(s.text, from, to - from);
    lines.insert(lines.end(), s.lines.begin() + from, s.lines.begin() + to);
  }
  void truncate(size_t n) {
    text.resize(n);
    lines.resize(n);
  }
};

bool is_line_start(const std::string& s, size_t i) {
  if (i == 0) return true;
  const char prev = s[i - 1];
  if (prev == '\n' || prev == '\r') return true;
  // U+2028 / U+2029 (E2 80 A8/A9) also end lines for a JavaScript /m regex.
  return i >= 3 && static_cast<unsigned char>(s[i - 3]) == 0xE2 && static_cast<unsigned char>(s[i - 2]) == 0x80 &&
         (static_cast<unsigned char>(s[i - 1]) == 0xA8 || static_cast<unsigned char>(s[i - 1]) == 0xA9);
}

// /^[ \t]*({[#%-])/gm → "$1"
Source lstrip_blocks(const Source& in) {
  Source out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size();) {
    if (is_line_start(s, i)) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' && (s[j + 1] == '#' || s[j + 1] == '%' || s[j + 1] == '-')) {
        out.append(in, j, j + 2);
        i = j + 2;
        continue;
      }
    }
    out.push(s[i], in.lines[i]);
    ++i;
  }
  return out;
}

// /([#%-]})\n/g → "$1"
Source trim_blocks(const Source& in) {
  Source out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size(); ++i) {
    out.push(s[i], in.lines[i]);
    if (i + 2 < s.size() && (s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' && s[i + 2] == '\n') {
      out.push('}', in.lines[i + 1]);
      i += 2;
    }
  }
  return out;
}

bool space_at(const std::string& s, size_t i, size_t* next) {
  size_t j = i;
  const char32_t cp = next_code_point(s, j);
  if (!is_js_space(cp)) return false;
  *next = j;
  return true;
}

// Matches {%-? \s* (end)?generation \s* -?%} at i; returns the end and the dashes.
bool match_generation(const std::string& s, size_t i, size_t* end, bool* lstrip, bool* rstrip) {
  if (s.compare(i, 2, "{%") != 0) return false;
  size_t j = i + 2, n = 0;
  *lstrip = j < s.size() && s[j] == '-';
  if (*lstrip) ++j;
  while (j < s.size() && space_at(s, j, &n)) j = n;
  if (s.compare(j, 3, "end") == 0 && s.compare(j + 3, 10, "generation") == 0) j += 3;
  if (s.compare(j, 10, "generation") != 0) return false;
  j += 10;
  while (j < s.size() && space_at(s, j, &n)) j = n;
  *rstrip = j < s.size() && s[j] == '-';
  if (*rstrip) ++j;
  if (s.compare(j, 2, "%}") != 0) return false;
  *end = j + 2;
  return true;
}

// transformers' {% generation %} / {% endgeneration %} only mark assistant
// spans for training masks: the tags vanish, keeping or dropping the
// surrounding whitespace per their dashes.
Source strip_generation_tags(const Source& in) {
  Source out;
  const std::string& s = in.text;
  size_t ws_out = 0;   // where the current whitespace run starts in `out`
  bool in_ws = false;  // is `out` currently ending in a whitespace run?
  for (size_t i = 0; i < s.size();) {
    size_t end = 0;
    bool lstrip = false, rstrip = false;
    if (s[i] == '{' && match_generation(s, i, &end, &lstrip, &rstrip)) {
      if (lstrip && in_ws) out.truncate(ws_out);
      size_t j = end, n = 0;
      while (j < s.size() && space_at(s, j, &n)) j = n;
      if (!rstrip) out.append(in, end, j);
      i = j;
      in_ws = false;  // the whitespace after a tag belongs to that match
      continue;
    }
    size_t n = 0;
    if (space_at(s, i, &n)) {
      if (!in_ws) ws_out = out.text.size();
      in_ws = true;
      out.append(in, i, n);
      i = n;
    } else {
      in_ws = false;
      out.push(s[i], in.lines[i]);
      ++i;
    }
  }
  return out;
}

Source preprocess(std::string_view template_text) {
  Source src;
  int line = 1;
  for (char c : template_text) {
    src.push(c, line);
    if (c == '\n') ++line;
  }
  if (!src.text.empty() && src.text.back() == '\n') src.truncate(src.text.size() - 1);
  return strip_generation_tags(trim_blocks(lstrip_blocks(src)));
}

constexpr std::array<std::pair<std::string_view, TokenType>, 29> kOperators = {{
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenBrace},       {"}", TokenType::kCloseBrace},
    {"[", TokenType::kOpenBracket},     {"]", TokenType::kCloseBracket},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
}};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_word(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

class Lexer {
 public:
  explicit Lexer(Source src) : src_(std::move(src)), s_(src_.text) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      const TokenType* last = tokens_.empty() ? nullptr : &tokens_.back().type;
      if (!last || *last == TokenType::kCloseStatement || *last == TokenType::kCloseExpression ||
          *last == TokenType::kComment) {
        if (lex_text()) continue;
      }
      if (starts_with("{#")) {
        lex_comment();
        continue;
      }
      if (starts_with("{%") && lex_raw()) continue;
      if (starts_with("{%-")) {
        strip_trailing_whitespace();
        push(TokenType::kOpenStatement, "{%", pos_);
        pos_ += 3;
        continue;
      }
      if (starts_with("{{-")) {
        strip_trailing_whitespace();
        push(TokenType::kOpenExpression, "{{", pos_);
        brace_depth_ = 0;
        pos_ += 3;
        continue;
      }
      skip_whitespace();
      if (pos_ >= s_.size()) syntax_error(line_at(s_.size() - 1), "unexpected end of template inside a tag");
      if (starts_with("-%}")) {
        push(TokenType::kCloseStatement, "%}", pos_);
        pos_ += 3;
        skip_whitespace();
        continue;
      }
      if (starts_with("-}}")) {
        push(TokenType::kCloseExpression, "}}", pos_);
        pos_ += 3;
        skip_whitespace();
        continue;
      }
      lex_in_tag();
    }
    return std::move(tokens_);
  }

 private:
  bool starts_with(std::string_view p) const { return s_.compare(pos_, p.size(), p) == 0; }
  int line_at(size_t i) const { return src_.lines.empty() ? 1 : src_.lines[std::min(i, src_.lines.size() - 1)]; }
  void push(TokenType type, std::string value, size_t at) { tokens_.push_back({type, std::move(value), line_at(at)}); }

  void skip_whitespace() {
    size_t n = 0;
    while (pos_ < s_.size() && space_at(s_, pos_, &n)) pos_ = n;
  }

  void strip_trailing_whitespace() {
    if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
    tokens_.back().value = js_trim(tokens_.back().value, false, true);
    if (tokens_.back().value.empty()) tokens_.pop_back();
  }

  bool lex_text() {
    const size_t start = pos_;
    while (pos_ < s_.size() && !(s_[pos_] == '{' && pos_ + 1 < s_.size() &&
                                 (s_[pos_ + 1] == '%' || s_[pos_ + 1] == '{' || s_[pos_ + 1] == '#')))
      ++pos_;
    if (pos_ == start) return false;
    push(TokenType::kText, s_.substr(start, pos_ - start), start);
    return true;
  }

  void lex_comment() {
    const size_t start = pos_;
    pos_ += 2;
    const bool strip_before = pos_ < s_.size() && s_[pos_] == '-';
    if (strip_before) ++pos_;
    const size_t close = s_.find("#}", pos_);
    if (close == std::string::npos) syntax_error(line_at(start), "comment is never closed with '#}}'");
    std::string body = s_.substr(pos_, close - pos_);
    const bool strip_after = !body.empty() && body.back() == '-';
    if (strip_after) body.pop_back();
    if (strip_before) strip_trailing_whitespace();
    push(TokenType::kComment, std::move(body), start);
    pos_ = close + 2;
    if (strip_after) skip_whitespace();
  }

  // {% raw %}...{% endraw %}: the body is text. Not in the reference engine
  // (it rejects `raw`); this follows Jinja.
  bool lex_raw() {
    size_t j = pos_ + 2, n = 0;
    const bool lstrip = j < s_.size() && s_[j] == '-';
    if (lstrip) ++j;
    while (j < s_.size() && space_at(s_, j, &n)) j = n;
    if (s_.compare(j, 3, "raw") != 0 || (j + 3 < s_.size() && is_word(s_[j + 3]))) return false;
    j += 3;
    while (j < s_.size() && space_at(s_, j, &n)) j = n;
    const bool rstrip = j < s_.size() && s_[j] == '-';
    if (rstrip) ++j;
    if (s_.compare(j, 2, "%}") != 0) syntax_error(line_at(pos_), "expected '%}}' after 'raw'");
    const size_t body_start = j + 2;
    // Find {%-? endraw -?%}
    for (size_t k = body_start; (k = s_.find("{%", k)) != std::string::npos; k += 2) {
      size_t e = k + 2;
      const bool end_lstrip = e < s_.size() && s_[e] == '-';
      if (end_lstrip) ++e;
      while (e < s_.size() && space_at(s_, e, &n)) e = n;
      if (s_.compare(e, 6, "endraw") != 0) continue;
      e += 6;
      while (e < s_.size() && space_at(s_, e, &n)) e = n;
      const bool end_rstrip = e < s_.size() && s_[e] == '-';
      if (end_rstrip) ++e;
      if (s_.compare(e, 2, "%}") != 0) continue;
      if (lstrip) strip_trailing_whitespace();
      std::string body = s_.substr(body_start, k - body_start);
      if (rstrip) body = js_trim(body, true, false);
      if (end_lstrip) body = js_trim(body, false, true);
      // The text is followed by a synthetic close so the next text lexes normally.
      if (!body.empty()) push(TokenType::kText, std::move(body), body_start);
      push(TokenType::kComment, "", k);
      pos_ = e + 2;
      if (end_rstrip) skip_whitespace();
      return true;
    }
    syntax_error(line_at(pos_), "'raw' block is never closed with '{{% endraw %}}'");
  }

  std::string lex_digits() {
    const size_t start = pos_;
    while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  std::string lex_number_tail(std::string num) {
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' && is_digit(s_[pos_ + 1])) {
      ++pos_;
      num += "." + lex_digits();
    }
    return num;
  }

  void lex_in_tag() {
    const size_t start = pos_;
    const char c = s_[pos_];
    if (c == '-' || c == '+') {
      const TokenType* last = tokens_.empty() ? nullptr : &tokens_.back().type;
      if (!last || *last == TokenType::kText) syntax_error(line_at(pos_), "unexpected character '{}'", c);
      const bool binary = *last == TokenType::kIdentifier || *last == TokenType::kNumber ||
                          *last == TokenType::kString || *last == TokenType::kCloseParen ||
                          *last == TokenType::kCloseBracket;
      if (!binary) {
        ++pos_;
        std::string num = lex_digits();
        if (!num.empty()) num = lex_number_tail(std::move(num));
        const bool has_number = !num.empty();
        push(has_number ? TokenType::kNumber : TokenType::kUnary, std::string(1, c) + num, start);
        return;
      }
    }
    for (const auto& [seq, type] : kOperators) {
      if (seq == "}}" && brace_depth_ > 0) continue;
      if (!starts_with(seq)) continue;
      push(type, std::string(seq), start);
      if (type == TokenType::kOpenExpression) brace_depth_ = 0;
      if (type == TokenType::kOpenBrace) ++brace_depth_;
      if (type == TokenType::kCloseBrace) --brace_depth_;
      pos_ += seq.size();
      return;
    }
    if (c == '\'' || c == '"') {
      push(TokenType::kString, lex_string(c), start);
      return;
    }
    if (is_digit(c)) {
      std::string num = lex_digits();
      if (tokens_.empty() || tokens_.back().type != TokenType::kDot) num = lex_number_tail(std::move(num));
      push(TokenType::kNumber, std::move(num), start);
      return;
    }
    if (is_word(c)) {
      while (pos_ < s_.size() && is_word(s_[pos_])) ++pos_;
      push(TokenType::kIdentifier, s_.substr(start, pos_ - start), start);
      return;
    }
    size_t end = pos_;
    std::string ch;
    append_utf8(ch, next_code_point(s_, end));
    syntax_error(line_at(pos_), "unexpected character '{}'", ch);
  }

  std::string lex_string(char quote) {
    const size_t start = pos_++;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) syntax_error(line_at(start), "string literal is never closed");
      const char c = s_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) syntax_error(line_at(start), "string literal is never closed");
      const char e = s_[pos_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case 'x':
        case 'u': {
          const size_t len = e == 'x' ? 2 : 4;
          const std::string hex = s_.substr(pos_, len);
          if (hex.size() != len || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            syntax_error(line_at(pos_), "invalid escape sequence \\{}{}", e, hex);
          char32_t cp = static_cast<char32_t>(std::stoul(hex, nullptr, 16));
          pos_ += len;
          // A surrogate pair written as two \u escapes is one code point.
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
            const std::string lo = s_.substr(pos_ + 2, 4);
            if (lo.size() == 4 && lo.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
              const auto low = static_cast<char32_t>(std::stoul(lo, nullptr, 16));
              if (low >= 0xDC00 && low < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                pos_ += 6;
              }
            }
          }
          append_utf8(out, cp);
          break;
        }
        default:
          // Python keeps unknown escapes as written ("\d" stays "\d").
          out += '\\';
          out += e;
      }
    }
    ++pos_;  // closing quote
    return out;
  }

  Source src_;
  const std::string& s_;
  size_t pos_ = 0;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(preprocess(source)).run();
}

}  // namespace kettle::jinja
