#include "server/literal_content.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace kettle::server {
namespace {

constexpr std::string_view kOpen = "\xEE\x80\x80";   // U+E000
constexpr std::string_view kClose = "\xEE\x80\x81";  // U+E001

uint16_t first_two(std::string_view s) {
  return static_cast<uint16_t>(static_cast<unsigned char>(s[0]) << 8 | static_cast<unsigned char>(s[1]));
}

}  // namespace

LiteralContent::LiteralContent(const std::vector<std::string>& special_strings) : specials_(special_strings) {
  for (size_t i = 0; i < specials_.size(); ++i) {
    if (specials_[i].size() == 1)
      one_byte_.push_back(i);
    else if (specials_[i].size() > 1)
      by_first_two_[first_two(specials_[i])].push_back(i);
  }
  for (auto& [key, list] : by_first_two_)
    std::sort(list.begin(), list.end(), [&](size_t a, size_t b) { return specials_[a].size() > specials_[b].size(); });
  std::random_device rd;
  nonce_ = fmt::format("{:08x}{:08x}", rd(), rd());
}

void LiteralContent::mark_text(std::string& text) {
  std::string out;
  size_t copied = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string_view rest = std::string_view(text).substr(i);
    const std::string* hit = nullptr;
    if (rest.size() >= 2) {
      if (auto it = by_first_two_.find(first_two(rest)); it != by_first_two_.end())
        for (size_t k : it->second)
          if (rest.substr(0, specials_[k].size()) == specials_[k]) {
            hit = &specials_[k];
            break;
          }
    }
    for (size_t k : one_byte_)
      if (!hit && rest[0] == specials_[k][0]) hit = &specials_[k];
    if (!hit) continue;
    out.append(text, copied, i - copied);
    out += fmt::format("{}{}:{}{}", kOpen, nonce_, marked_.size(), kClose);
    marked_.push_back(*hit);
    i += hit->size() - 1;
    copied = i + 1;
  }
  if (marked_.empty() && copied == 0) return;
  out.append(text, copied, std::string::npos);
  text = std::move(out);
}

void LiteralContent::mark(nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return;
  for (auto& message : messages) {
    if (!message.is_object() || !message.contains("content")) continue;
    auto& content = message["content"];
    if (content.is_string()) {
      mark_text(content.get_ref<std::string&>());
    } else if (content.is_array()) {
      for (auto& part : content)
        if (part.is_object() && part.contains("text") && part["text"].is_string()) mark_text(part["text"].get_ref<std::string&>());
    }
  }
}

std::vector<Tokenizer::Span> LiteralContent::restore(std::string& text) const {
  std::vector<Tokenizer::Span> spans;
  if (marked_.empty()) return spans;
  const std::string prefix = std::string(kOpen) + nonce_ + ":";
  std::string out;
  size_t copied = 0;
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, copied)) {
    const size_t digits = at + prefix.size();
    const size_t close = text.find(kClose, digits);
    if (close == std::string::npos || close == digits || close - digits > 9) break;
    const size_t index = std::stoul(text.substr(digits, close - digits));
    if (index >= marked_.size()) break;
    out.append(text, copied, at - copied);
    spans.push_back({out.size(), out.size() + marked_[index].size()});
    out += marked_[index];
    copied = close + kClose.size();
  }
  out.append(text, copied, std::string::npos);
  text = std::move(out);
  return spans;
}

}  // namespace kettle::server
