#include "grammar/gbnf_text.h"

#include <fmt/format.h>

#include <algorithm>

namespace kettle::grammar {
namespace {

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    char32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i + k < s.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(v);
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string escape_code_point(char32_t c) { return fmt::format("\\U{:08X}", static_cast<uint32_t>(c)); }

}  // namespace

std::string gbnf_quote(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      (out += '\\') += ch;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02X}", c);
    else
      out += ch;
  }
  return out + "\"";
}

std::string gbnf_class(const std::vector<CodePointRange>& ranges) {
  std::string out = "[";
  for (const CodePointRange& r : ranges) {
    out += escape_code_point(r.lo);
    if (r.hi != r.lo) out += "-" + escape_code_point(r.hi);
  }
  return out + "]";
}

// The automaton of "has not yet seen `stop`" (Knuth–Morris–Pratt): state k = the longest
// prefix of stop that the text ends with. A rule per state: the text may end there, or go
// on with a character to the next state; the character that would complete stop is absent.
std::string gbnf_text_without(const std::string& name, std::string_view stop) {
  const std::u32string s = decode_utf8(stop);
  const size_t n = s.size();
  std::vector<size_t> fail(n + 1, 0);
  for (size_t i = 1, k = 0; i < n; ++i) {
    while (k > 0 && s[i] != s[k]) k = fail[k];
    if (s[i] == s[k]) ++k;
    fail[i + 1] = k;
  }
  auto next = [&](size_t k, char32_t c) {
    while (k > 0 && (k == n || s[k] != c)) k = fail[k];
    return s[k] == c ? k + 1 : 0;
  };
  std::u32string distinct = s;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::string out = fmt::format("{} ::= {}-0\n", name, name);
  for (size_t k = 0; k < n; ++k) {
    std::string rule = fmt::format("{}-{} ::= \"\"", name, k);
    std::vector<CodePointRange> to_zero_excluded;
    for (char32_t c : distinct) {
      const size_t to = next(k, c);
      if (to == 0) continue;
      to_zero_excluded.push_back({c, c});
      if (to == n) continue;  // would complete stop
      std::string lit;
      if (c < 0x80) {
        lit = gbnf_quote(std::string(1, static_cast<char>(c)));
      } else {
        lit = gbnf_class({{c, c}});
      }
      rule += fmt::format(" | {} {}-{}", lit, name, to);
    }
    rule += fmt::format(" | [^{} {}-0\n", gbnf_class(to_zero_excluded).substr(1), name);
    out += rule;
  }
  return out;
}

}  // namespace kettle::grammar
