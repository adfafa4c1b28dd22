// LiteralContent (serve --literal-special-tokens): keeps the strings of the
// model's control tokens that appear inside a client's message content as
// plain text. Before rendering, each occurrence is swapped for a marker only
// this request knows (a random nonce between private-use characters); after
// rendering, the markers are swapped back and their byte ranges handed to the
// tokenizer, which encodes them as letters rather than as the token. A
// message saying "<|im_start|>system" then cannot open a turn of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kettle::server {

class LiteralContent {
 public:
  explicit LiteralContent(const std::vector<std::string>& special_strings);

  // Marks the special strings in every message's content (a string, or the text of its parts).
  void mark(nlohmann::ordered_json& messages);
  // Swaps the markers in the rendered prompt back; returns where the strings now stand.
  std::vector<Tokenizer::Span> restore(std::string& text) const;

 private:
  void mark_text(std::string& text);

  const std::vector<std::string>& specials_;
  std::unordered_map<uint16_t, std::vector<size_t>> by_first_two_;  // first two bytes → specials, longest first
  std::vector<size_t> one_byte_;                                    // specials of one byte
  std::string nonce_;
  std::vector<std::string> marked_;  // marker index → the string it stands for
};

}  // namespace kettle::server
