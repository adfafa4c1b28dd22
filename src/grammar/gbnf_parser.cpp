// GBNF text → Grammar. The format of llama.cpp's grammars:
//   rule-name ::= alternative | alternative ...      (a rule may span lines)
//   "literal" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes
//   [a-z0-9_] and [^...] classes (same escapes, plus \] \- \^), `.` any character
//   rule references, ( groups ), and the postfixes * + ? {m} {m,} {m,n}
//   # comments to the end of the line
#include "grammar/grammar.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar parse(std::string_view root) {
    skip_space();
    if (at_end()) error("the grammar is empty");
    while (!at_end()) {
      const std::string name = parse_name();
      skip_space();
      if (!consume("::=")) error(fmt::format("expected '::=' after the rule name '{}'", name));
      const int32_t id = builder_.rule(name);
      if (builder_.defined(id)) error(fmt::format("rule '{}' is defined twice", name));
      for (auto& alt : parse_alternatives(false)) builder_.add(id, std::move(alt));
    }
    return builder_.finish(root);
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    fail(ErrorCategory::kInvalidArgument, "grammar line {} column {}: {}", line, column, what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  bool consume(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) error(fmt::format("expected a rule name, found '{}'", peek()));
    return std::string(text_.substr(start, pos_ - start));
  }

  // A name followed by '::=' starts the next rule.
  bool at_rule_start() const {
    size_t i = pos_;
    while (i < text_.size() && is_name_char(text_[i])) ++i;
    if (i == pos_) return false;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r')) ++i;
    return text_.substr(i, 3) == "::=";
  }

  std::vector<GrammarBuilder::Sequence> parse_alternatives(bool nested) {
    std::vector<GrammarBuilder::Sequence> alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  GrammarBuilder::Sequence parse_sequence(bool nested) {
    GrammarBuilder::Sequence seq;
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || (nested && peek() == ')')) break;
      if (!nested && at_rule_start()) break;
      if (peek() == ')') error("unbalanced ')'");
      GrammarBuilder::Sequence item = parse_item();
      if (const char p = peek(); p == '*' || p == '+' || p == '?' || p == '{') {
        int min = 0, max = -1;
        parse_postfix(min, max);
        item = {builder_.repeat(item, min, max)};
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  GrammarBuilder::Sequence parse_item() {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (peek() != '"') {
        if (at_end()) error("unterminated string literal");
        unicode::append_utf8(bytes, parse_char());
      }
      ++pos_;
      return builder_.literal(bytes);
    }
    if (c == '[') return {parse_class()};
    if (c == '.') {
      ++pos_;
      return {builder_.code_points({}, true)};
    }
    if (c == '(') {
      ++pos_;
      if (++depth_ > kMaxDepth) error(fmt::format("groups nested deeper than {}", kMaxDepth));
      auto alts = parse_alternatives(true);
      --depth_;
      if (peek() != ')') error("expected ')'");
      ++pos_;
      if (alts.size() == 1) return alts[0];
      const int32_t id = builder_.helper("alt");
      for (auto& alt : alts) builder_.add(id, std::move(alt));
      return {builder_.ref(id)};
    }
    if (is_name_char(c)) return {builder_.ref(builder_.rule(parse_name()))};
    error(fmt::format("unexpected '{}'", c));
  }

  Element parse_class() {
    ++pos_;  // '['
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    std::vector<CodePointRange> ranges;
    while (peek() != ']') {
      if (at_end()) error("unterminated character class");
      const char32_t lo = parse_char();
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("a character range is the wrong way round");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    return builder_.code_points(std::move(ranges), negated);
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) error(fmt::format("expected {} hex digits", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class (UTF-8 decoded), escapes resolved.
  char32_t parse_char() {
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': {
          const uint32_t v = parse_hex(8);
          if (v > 0x10FFFF) error("a \\U escape above U+10FFFF");
          return v;
        }
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.': return static_cast<unsigned char>(e);
        default: error(fmt::format("unknown escape '\\{}'", e));
      }
    }
    // UTF-8 in the grammar text itself.
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > text_.size()) error("invalid UTF-8 in the grammar");
    char32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) error("invalid UTF-8 in the grammar");
      v = (v << 6) | (b & 0x3F);
    }
    pos_ += n;
    return v;
  }

  int parse_count() {
    const size_t start = pos_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > GrammarBuilder::kMaxRepeat) error(fmt::format("a repetition count above {}", GrammarBuilder::kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) error("expected a number in '{...}'");
    return static_cast<int>(v);
  }

  void parse_postfix(int& min, int& max) {
    const char c = peek();
    ++pos_;
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else {  // '{'
      skip_space();
      min = parse_count();
      skip_space();
      max = min;
      if (peek() == ',') {
        ++pos_;
        skip_space();
        max = peek() == '}' ? -1 : parse_count();
        skip_space();
      }
      if (peek() != '}') error("expected '}'");
      ++pos_;
      if (max >= 0 && max < min) error("a repetition {m,n} with n < m");
    }
  }

  static constexpr int kMaxDepth = 100;
  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  GrammarBuilder builder_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view root) { return GbnfParser(text).parse(root); }

}  // namespace kettle::grammar
