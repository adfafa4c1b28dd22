// UTF-8 decoding, lossy repair of invalid input (as Rust's String::from_utf8_lossy)
// and the character classes the Hugging Face components test with (Rust's char
// predicates and the regex crate's \w).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kettle::unicode {

// Length of the UTF-8 sequence led by `lead` in valid UTF-8 (1 for ASCII).
inline size_t seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Decodes the character at s[i] of valid UTF-8 and advances i past it.
inline char32_t next_char(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t n = seq_len(b0);
  char32_t c = b0 & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

// Decodes the character ending at s[end) of valid UTF-8 and moves end to its start.
inline char32_t prev_char(std::string_view s, size_t& end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t i = start;
  end = start;
  return next_char(s, i);
}

void append_utf8(std::string& out, char32_t c);

// True when s is well-formed UTF-8 (no surrogates, no overlongs, ≤ U+10FFFF).
bool is_valid_utf8(std::string_view s);

// s itself when valid; otherwise `storage` filled with s where every maximal
// invalid subpart is replaced by U+FFFD (the Unicode / WHATWG / Rust rule).
std::string_view repair_utf8(std::string_view s, std::string& storage);

// Rust char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// HF `is_punc`: ASCII punctuation or a Unicode P* category.
bool is_punctuation(char32_t c);
// The regex crate's Unicode \w: Alphabetic, M*, Nd, Pc, Join_Control.
bool is_word_char(char32_t c);

}  // namespace kettle::unicode
