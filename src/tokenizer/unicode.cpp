// UTF-8 repair and Unicode character classes for the tokenizer; ICU answers the
// category questions outside ASCII so the tables match the Unicode version in use.
#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

namespace kettle::unicode {

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

namespace {

// Length of the longest valid prefix of a UTF-8 sequence at s[i] (0 when s[i]
// cannot start one); `complete` says whether it is a whole character. The
// second-byte ranges exclude overlongs, surrogates and code points past U+10FFFF.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  complete = false;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    complete = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t n = 1;
  for (; n < need && i + n < s.size(); ++n) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    if (n == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  complete = n == need;
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Skip ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    bool complete;
    const size_t n = valid_prefix(s, i, complete);
    if (!complete) return false;
    i += n;
  }
  return true;
}

std::string_view repair_utf8(std::string_view s, std::string& storage) {
  if (is_valid_utf8(s)) return s;
  storage.clear();
  storage.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    bool complete;
    const size_t n = valid_prefix(s, i, complete);
    if (complete) {
      storage.append(s.data() + i, n);
      i += n;
    } else {
      storage.append("\xEF\xBF\xBD");
      i += n == 0 ? 1 : n;
    }
  }
  return storage;
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return u_ispunct(static_cast<UChar32>(c));
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const auto u = static_cast<UChar32>(c);
  const int32_t mask = U_GET_GC_MASK(u);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
}

}  // namespace kettle::unicode
