// A compiled PCRE2 (JIT) pattern standing in for the Oniguruma regexes Hugging
// Face tokenizers use in Split, Replace and ByteLevel; matching is thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace kettle {

class Regex {
 public:
  // `literal`: the pattern is a plain string (HF's {"String": ...} patterns).
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for every non-empty, non-overlapping match in
  // the valid UTF-8 `text`, left to right (empty matches are skipped, as they
  // split nothing in HF either).
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    size_t pos = 0;
    size_t start = 0, end = 0;
    while (pos <= text.size() && next_match(text, pos, start, end)) {
      if (end > start) {
        on_match(start, end);
        pos = end;
      } else {
        // Step over one whole character after an empty match.
        pos = end + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  bool next_match(std::string_view text, size_t from, size_t& start, size_t& end) const;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace kettle
