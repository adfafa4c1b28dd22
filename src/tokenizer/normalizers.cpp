// tokenizer.json normalizers: Unicode forms (ICU), Lowercase, Strip, StripAccents,
// Replace, Prepend and Sequence, each reproducing the HF tokenizers rule it names.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/ucasemap.h>
#include <unicode/uchar.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::tok {
namespace {

using nlohmann::json;

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

class UnicodeForm : public Normalizer {
 public:
  UnicodeForm(const std::string& type, const std::string& where) {
    UErrorCode status = U_ZERO_ERROR;
    if (type == "NFC")
      norm_ = icu::Normalizer2::getNFCInstance(status);
    else if (type == "NFD")
      norm_ = icu::Normalizer2::getNFDInstance(status);
    else if (type == "NFKC")
      norm_ = icu::Normalizer2::getNFKCInstance(status);
    else
      norm_ = icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status))
      fail(ErrorCategory::kInternal, "{}: ICU has no {} normalizer: {}", where, type, u_errorName(status));
  }
  void normalize(std::string& s) const override {
    if (is_ascii(s)) return;  // ASCII is invariant under every normalization form
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
    if (norm_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
    norm_->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_FAILURE(status)) fail(ErrorCategory::kInternal, "Unicode normalization failed: {}", u_errorName(status));
    s = std::move(out);
  }

 private:
  const icu::Normalizer2* norm_ = nullptr;
};

// HF lowercases char by char (char::to_lowercase: full mappings such as
// U+0130 → "i̇", but no final-sigma context), so ICU is asked one char at a time.
class Lowercase : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    if (is_ascii(s)) {
      for (char& c : s)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      return;
    }
    UErrorCode status = U_ZERO_ERROR;
    UCaseMap* map = ucasemap_open("", 0, &status);
    std::string out;
    out.reserve(s.size() + 8);
    char buf[32];
    for (size_t i = 0; i < s.size();) {
      const size_t start = i;
      const char32_t c = unicode::next_char(s, i);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
        continue;
      }
      status = U_ZERO_ERROR;
      const int32_t n =
          ucasemap_utf8ToLower(map, buf, sizeof buf, s.data() + start, static_cast<int32_t>(i - start), &status);
      if (U_FAILURE(status))
        out.append(s, start, i - start);
      else
        out.append(buf, static_cast<size_t>(n));
    }
    ucasemap_close(map);
    s = std::move(out);
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t end = s.size();
    if (right_) {
      while (end > 0) {
        size_t e = end;
        if (!unicode::is_whitespace(unicode::prev_char(s, e))) break;
        end = e;
      }
    }
    size_t begin = 0;
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!unicode::is_whitespace(unicode::next_char(s, i))) break;
        begin = i;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Removes combining marks (Rust's is_combining_mark: M* categories).
class StripAccents : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    if (is_ascii(s)) return;
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const size_t start = i;
      const char32_t c = unicode::next_char(s, i);
      if ((U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_M_MASK) == 0) out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

class Replace : public Normalizer {
 public:
  Replace(const json& pattern, std::string content, const std::string& where) : content_(std::move(content)) {
    if (pattern.contains("String")) {
      literal_ = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex")) {
      regex_.emplace(pattern["Regex"].get<std::string>(), false);
    } else {
      fail(ErrorCategory::kInvalidData, "{}: Replace pattern must be {{\"String\"}} or {{\"Regex\"}}", where);
    }
  }
  void normalize(std::string& s) const override {
    if (!regex_) {
      if (literal_.empty() || s.find(literal_) == std::string::npos) return;
      std::string out;
      out.reserve(s.size() + s.size() / 2);
      size_t pos = 0;
      for (size_t hit; (hit = s.find(literal_, pos)) != std::string::npos; pos = hit + literal_.size()) {
        out.append(s, pos, hit - pos);
        out += content_;
      }
      out.append(s, pos, std::string::npos);
      s = std::move(out);
      return;
    }
    std::string out;
    size_t pos = 0;
    regex_->for_each_match(s, [&](size_t start, size_t end) {
      out.append(s, pos, start - pos);
      out += content_;
      pos = end;
    });
    if (pos == 0 && out.empty()) return;
    out.append(s, pos, std::string::npos);
    s = std::move(out);
  }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& step : steps_) step->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
    return std::make_unique<UnicodeForm>(type, where);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Replace") return std::make_unique<Replace>(j.at("pattern"), j.value("content", ""), where);
  if (type == "Prepend") return std::make_unique<Prepend>(j.value("prepend", ""));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const json& step : j.at("normalizers"))
      if (auto n = make_normalizer(step, where)) steps.push_back(std::move(n));
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(ErrorCategory::kUnsupported, "{}: normalizer type \"{}\" is not supported", where, type);
}

}  // namespace kettle::tok
