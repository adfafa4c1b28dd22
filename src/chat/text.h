// UTF-8 and number-formatting helpers for the chat-template interpreter. The
// reference (@huggingface/jinja) runs on JavaScript strings and numbers, so
// whitespace classes and number printing follow ECMAScript here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kettle::jinja {

// Decodes one code point at s[i] and advances i; malformed bytes decode as
// U+FFFD one byte at a time (inputs come from nlohmann::json, already valid).
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);
size_t code_point_count(std::string_view s);

// ECMAScript WhiteSpace + LineTerminator (what JS /\s/ and String.trim use).
bool is_js_space(char32_t cp);
std::string js_trim(std::string_view s, bool left, bool right);
// Python str.strip(chars): removes any of `chars` (code points) from the ends.
std::string strip_chars(std::string_view s, std::string_view chars, bool left, bool right);

// Full Unicode case mapping (ICU root locale), as JS toUpperCase/toLowerCase.
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);

// Number.prototype.toString for a double: shortest round-trip digits,
// exponent form outside [1e-7, 1e21).
std::string js_number(double v);

}  // namespace kettle::jinja
