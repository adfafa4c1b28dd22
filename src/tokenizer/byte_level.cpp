// GPT-2's bytes_to_unicode table: every byte maps to a printable character so BPE
// vocabularies can be stored as text ('!'..'~', '¡'..'¬', '®'..'ÿ' map to
// themselves, the other 68 bytes to U+0100 onwards in byte order).
#include <array>

#include "tokenizer/components.h"
#include "tokenizer/unicode.h"

namespace kettle::tok {
namespace {

struct ByteTable {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> from_unicode;  // every mapped char is below U+0200
  ByteTable() {
    from_unicode.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      unicode::append_utf8(to_unicode[static_cast<size_t>(b)], c);
      from_unicode[c] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) {
  return table().to_unicode[b];
}

int byte_from_unicode(char32_t c) {
  return c < 512 ? table().from_unicode[c] : -1;
}

}  // namespace kettle::tok
