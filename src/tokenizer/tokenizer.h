// kettle::Tokenizer: loads a Hugging Face tokenizer.json and encodes / decodes
// exactly as the `tokenizers` library does (BPE models: byte-level and
// SentencePiece-style). Const methods are safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kettle {

class Tokenizer {
 public:
  // A tokenizer.json file, or a folder containing one.
  static Tokenizer from_file(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // A byte range [begin, end) of an encoded text.
  struct Span {
    size_t begin, end;
  };

  // Invalid UTF-8 in `text` is read as U+FFFD, as String::from_utf8_lossy does.
  // Special tokens' strings inside a `literal` span are encoded as plain text (a
  // client's message that spells "<|im_start|>" gets the letters, not the token).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true,
                              const std::vector<Span>& literal = {}) const;
  // Unknown ids are skipped, as in HF.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" when out of range
  // The bytes `id` adds in the middle of a decoded text (byte-level pieces mapped back to
  // bytes, "<0xHH>" fallbacks to their byte, "▁" to a space). Special added tokens and
  // unknown ids give "".
  std::string token_bytes(int32_t id) const;
  int64_t vocab_size() const;                 // model vocab + added tokens (max id + 1)
  bool is_special(int32_t id) const;
  // The strings of the special added tokens (what a chat template's control tokens spell).
  std::vector<std::string> special_token_strings() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kettle
