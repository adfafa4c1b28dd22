// StreamDecoder (sliding-window incremental decode) and StopMatcher (stop
// strings split across pushes). An unfinished UTF-8 character shows up in a
// lossy decode as a trailing U+FFFD, so trailing U+FFFDs are held back until a
// later token settles them.
#include "tokenizer/stream_decoder.h"

#include <algorithm>
#include <cctype>

namespace kettle {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
// Window sizes: decode at most kSlideAt ids per push, keep kContext ids of
// context so leading-space rules (Metaspace) and partial bytes see their left side.
constexpr size_t kSlideAt = 16;
constexpr size_t kContext = 6;
// A run of U+FFFD this long is real output (invalid bytes), not an unfinished character.
constexpr size_t kMaxHeld = 64;

size_t trailing_replacements(std::string_view text) {
  size_t n = text.size();
  while (n >= kReplacement.size() && text.substr(n - kReplacement.size(), kReplacement.size()) == kReplacement)
    n -= kReplacement.size();
  return text.size() - n;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::decode_window() const {
  return tokenizer_->decode(ids_, skip_special_);
}

// HF's ByteFallback decoder renders a run of "<0xHH>" tokens as a whole (one
// U+FFFD per byte when the run is invalid), so a run's text is only final once
// a token of another kind ends it.
bool StreamDecoder::is_byte_token(const std::string& t) {
  return t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  if (is_byte_token(tokenizer_->id_to_token(id)) && ids_.size() <= kMaxHeld) return {};
  const std::string text = decode_window();
  const size_t held = ids_.size() > kMaxHeld ? 0 : trailing_replacements(text);
  const size_t stable = text.size() - held;
  std::string out;
  if (stable > emitted_) {
    out = text.substr(emitted_, stable - emitted_);
    emitted_ = stable;
  }
  if (held == 0 && ids_.size() > kSlideAt) {
    // Everything is emitted: keep only recent context; its decode counts as emitted.
    ids_.erase(ids_.begin(), ids_.end() - static_cast<std::ptrdiff_t>(kContext));
    emitted_ = decode_window().size();
  }
  return out;
}

std::string StreamDecoder::finish() {
  const std::string text = decode_window();
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  ids_.clear();
  emitted_ = 0;
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t pos = held_.find(stop);
    if (pos < first) {
      first = pos;
      matched_ = stop;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kettle
