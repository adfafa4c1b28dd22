#include "grammar/regex_gbnf.h"

#include <fmt/format.h>

#include <algorithm>

#include "grammar/gbnf_text.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

using Ranges = std::vector<CodePointRange>;

Ranges complement(Ranges r) {
  std::sort(r.begin(), r.end(), [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  Ranges out;
  char32_t next = 0;
  for (const CodePointRange& x : r) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = std::max<char32_t>(next, x.hi + 1);
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexWriter {
 public:
  static constexpr int kMaxDepth = 100;

  RegexWriter(std::string_view pattern, const std::string& name, RegexMode mode, const std::string& any_char)
      : p_(pattern), name_(name), mode_(mode), any_char_(any_char) {}

  std::string write() {
    std::vector<std::string> branches;
    for (;;) {
      bool start_anchor = false, end_anchor = false;
      if (peek() == '^') {
        ++pos_;
        start_anchor = true;
      }
      std::string body = concat(true, end_anchor);
      if (mode_ == RegexMode::kJsonString) {
        if (!start_anchor) body = any_char_ + "* " + body;
        if (!end_anchor) body += " " + any_char_ + "*";
      }
      branches.push_back(body.empty() ? "\"\"" : body);
      if (at_end()) break;
      if (peek() == '|') {
        ++pos_;
        continue;
      }
      error(fmt::format("unbalanced '{}'", peek()));
    }
    std::string root = name_ + " ::= ";
    for (size_t i = 0; i < branches.size(); ++i) root += (i ? " | " : "") + branches[i];
    return root + "\n" + rules_;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(ErrorCategory::kInvalidArgument, "regular expression at offset {}: {}", pos_, what);
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < p_.size() ? p_[pos_ + k] : '\0'; }

  std::string alternation() {
    std::vector<std::string> alts;
    bool unused = false;
    for (;;) {
      std::string body = concat(false, unused);
      alts.push_back(body.empty() ? "\"\"" : body);
      if (peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return "(" + alts[0] + ")";
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  // Items up to '|', ')' or the end; at the top level a final '$' is the end anchor.
  std::string concat(bool top, bool& end_anchor) {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        ++pos_;
        if (top && (at_end() || peek() == '|')) {
          end_anchor = true;
          break;
        }
        error("'$' is only supported at the end of the pattern");
      }
      if (peek() == '^') error("'^' is only supported at the start of the pattern");
      std::string atom_text = atom();
      quantifier(atom_text);
      if (!out.empty()) out += ' ';
      out += atom_text;
    }
    if (!top && at_end() && depth_ > 0) error("missing ')'");
    return out;
  }

  void quantifier(std::string& atom_text) {
    const char c = peek();
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{' && std::isdigit(static_cast<unsigned char>(peek(1)))) {
      const size_t close = p_.find('}', pos_);
      if (close == std::string_view::npos) error("missing '}'");
      q = std::string(p_.substr(pos_, close - pos_ + 1));
      pos_ = close + 1;
      for (char d : q)
        if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',' && d != '{' && d != '}') error("a malformed {m,n}");
    } else {
      return;
    }
    if (peek() == '?') ++pos_;  // lazy: the same language
    if (peek() == '+') error("possessive quantifiers are not supported");
    atom_text = "(" + atom_text + ")" + q;
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        if (peek(1) == ':') {
          pos_ += 2;
        } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) error("an unterminated group name");
          pos_ = close + 1;
        } else {
          error("lookaround and other (? groups are not supported");
        }
      }
      if (++depth_ > kMaxDepth) error(fmt::format("groups nested deeper than {}", kMaxDepth));
      std::string inner = alternation();
      --depth_;
      if (peek() != ')') error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return class_text(parse_class());
    if (c == '.') {
      ++pos_;
      return class_text(complement({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') error(fmt::format("'{}' has nothing to repeat", c));
    if (c == '\\') {
      Ranges set;
      const char32_t ch = escape(set, false);
      if (!set.empty()) return class_text(set);
      return literal(ch);
    }
    return literal(next_char());
  }

  char32_t next_char() {
    const auto c = static_cast<unsigned char>(p_[pos_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > p_.size()) error("invalid UTF-8");
    char32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(p_[pos_ + k]) & 0x3F);
    pos_ += static_cast<size_t>(n);
    return v;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) error("expected a hex digit");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After '\': a character (returned) or a class (written to `set`).
  char32_t escape(Ranges& set, bool in_class) {
    ++pos_;
    if (at_end()) error("a trailing '\\'");
    const char e = p_[pos_++];
    switch (e) {
      case 'd': set = kDigit; return 0;
      case 'D': set = complement(kDigit); return 0;
      case 'w': set = kWord; return 0;
      case 'W': set = complement(kWord); return 0;
      case 's': set = kSpace; return 0;
      case 'S': set = complement(kSpace); return 0;
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'b':
        if (in_class) return '\b';
        error("word boundaries (\\b) are not supported");
      case 'B': error("\\B is not supported");
      default:
        if (e >= '1' && e <= '9') error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(e))) error(fmt::format("unknown escape '\\{}'", e));
        return static_cast<unsigned char>(e);
    }
  }

  // After '[': the class's code points.
  Ranges parse_class() {
    ++pos_;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    Ranges set;
    bool first = true;
    while (first || peek() != ']') {
      if (at_end()) error("missing ']'");
      first = false;
      Ranges sub;
      char32_t lo = peek() == '\\' ? escape(sub, true) : next_char();
      if (!sub.empty()) {
        set.insert(set.end(), sub.begin(), sub.end());
        continue;
      }
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        ++pos_;
        Ranges bad;
        hi = peek() == '\\' ? escape(bad, true) : next_char();
        if (!bad.empty()) error("a class escape cannot end a range");
        if (hi < lo) error("a range out of order");
      }
      set.push_back({lo, hi});
    }
    ++pos_;
    return negated ? complement(set) : set;
  }

  std::string literal(char32_t c) {
    std::string utf8;
    unicode::append_utf8(utf8, c);
    if (mode_ == RegexMode::kJsonString) return json_escaped(c);
    return gbnf_quote(utf8);
  }

  // A character as a JSON string spells it.
  static std::string json_escaped(char32_t c) {
    switch (c) {
      case '"': return gbnf_quote("\\\"");
      case '\\': return gbnf_quote("\\\\");
      case '\n': return gbnf_quote("\\n");
      case '\r': return gbnf_quote("\\r");
      case '\t': return gbnf_quote("\\t");
      case '\b': return gbnf_quote("\\b");
      case '\f': return gbnf_quote("\\f");
      default: break;
    }
    if (c < 0x20) return gbnf_quote(fmt::format("\\u{:04x}", static_cast<unsigned>(c)));
    std::string utf8;
    unicode::append_utf8(utf8, c);
    return gbnf_quote(utf8);
  }

  // A class as GBNF; in a JSON string the characters JSON escapes are written escaped.
  std::string class_text(const Ranges& set) {
    if (set.empty()) error("a class that matches nothing");
    if (mode_ != RegexMode::kJsonString) return gbnf_class(set);
    Ranges plain = set;
    std::vector<std::string> alts;
    for (char32_t c : {U'"', U'\\', U'\n', U'\r', U'\t'}) {
      const bool in = std::any_of(set.begin(), set.end(), [&](const CodePointRange& r) { return r.lo <= c && c <= r.hi; });
      if (in) alts.push_back(json_escaped(c));
    }
    // Without the characters JSON escapes (other control characters are left out).
    Ranges excluded = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    Ranges keep;
    for (CodePointRange r : plain) {
      std::vector<CodePointRange> pieces{r};
      for (const CodePointRange& x : excluded) {
        std::vector<CodePointRange> next;
        for (CodePointRange piece : pieces) {
          if (x.hi < piece.lo || x.lo > piece.hi) {
            next.push_back(piece);
            continue;
          }
          if (piece.lo < x.lo) next.push_back({piece.lo, x.lo - 1});
          if (piece.hi > x.hi) next.push_back({x.hi + 1, piece.hi});
        }
        pieces = std::move(next);
      }
      keep.insert(keep.end(), pieces.begin(), pieces.end());
    }
    if (!keep.empty()) alts.insert(alts.begin(), gbnf_class(keep));
    if (alts.empty()) error("a class that matches only control characters");
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::string name_;
  RegexMode mode_;
  std::string any_char_;
  std::string rules_;
  int depth_ = 0;
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, const std::string& name, RegexMode mode,
                          const std::string& any_char_rule) {
  if (mode == RegexMode::kJsonString && any_char_rule.empty())
    fail(ErrorCategory::kInternal, "regex_to_gbnf: kJsonString needs the rule of one JSON string character");
  return RegexWriter(pattern, name, mode, any_char_rule).write();
}

}  // namespace kettle::grammar
