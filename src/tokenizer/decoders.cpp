// tokenizer.json decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
// Replace and Sequence, each a copy of the HF decode_chain it is named after
// (including its quirks, so decode() matches the reference byte for byte).
#include <nlohmann/json.hpp>
#include <optional>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::tok {
namespace {

using nlohmann::json;

// Maps each character back to its byte; a token with any character outside the
// alphabet contributes its UTF-8 as is. The bytes are then decoded lossily.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes, mapped;
    for (const std::string& t : tokens) {
      mapped.clear();
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        const int b = byte_from_unicode(unicode::next_char(t, i));
        if (b < 0)
          ok = false;
        else
          mapped.push_back(static_cast<char>(b));
      }
      bytes += ok ? mapped : t;
    }
    std::string storage;
    const std::string_view text = unicode::repair_utf8(bytes, storage);
    tokens.assign(1, std::string(text));
  }
  void raw_piece(std::string& t) const override {
    std::string mapped;
    for (size_t i = 0; i < t.size();) {
      const int b = byte_from_unicode(unicode::next_char(t, i));
      if (b < 0) return;  // outside the alphabet: the UTF-8 as is
      mapped.push_back(static_cast<char>(b));
    }
    t = std::move(mapped);
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      if (t.find(replacement_) == std::string::npos) continue;
      std::string out;
      for (size_t pos = 0;;) {
        const size_t hit = t.find(replacement_, pos);
        out.append(t, pos, hit == std::string::npos ? std::string::npos : hit - pos);
        if (hit == std::string::npos) break;
        if (!(k == 0 && strip_first_)) out += ' ';
        pos = hit + replacement_.size();
      }
      t = std::move(out);
    }
  }
  void raw_piece(std::string& t) const override {
    std::string out;
    for (size_t pos = 0;;) {
      const size_t hit = t.find(replacement_, pos);
      out.append(t, pos, hit == std::string::npos ? std::string::npos : hit - pos);
      if (hit == std::string::npos) break;
      out += ' ';
      pos = hit + replacement_.size();
    }
    t = std::move(out);
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xHH>" tokens become bytes; a run of them that is not valid UTF-8 becomes
// one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::is_valid_utf8(pending))
        out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& t : tokens) {
      if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex_digit(t[3]) >= 0 && hex_digit(t[4]) >= 0) {
        pending.push_back(static_cast<char>(hex_digit(t[3]) * 16 + hex_digit(t[4])));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
  void raw_piece(std::string& t) const override {
    if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex_digit(t[3]) >= 0 && hex_digit(t[4]) >= 0)
      t.assign(1, static_cast<char>(hex_digit(t[3]) * 16 + hex_digit(t[4])));
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  void raw_piece(std::string&) const override {}
};

// HF's Strip keeps chars().skip(start_cut).take(len_in_bytes - cuts): with
// multi-byte characters the take() overshoots and the right cut is lost; copied.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<char32_t> chars;
    for (std::string& t : tokens) {
      chars.clear();
      for (size_t i = 0; i < t.size();) chars.push_back(unicode::next_char(t, i));
      size_t start_cut = 0;
      while (start_cut < chars.size() && start_cut < start_ && chars[start_cut] == content_) ++start_cut;
      size_t stop_cut = 0;
      while (stop_cut < chars.size() && stop_cut < stop_ && chars[chars.size() - 1 - stop_cut] == content_) ++stop_cut;
      const size_t cuts = start_cut + stop_cut;
      const size_t take = t.size() > cuts ? t.size() - cuts : 0;
      std::string out;
      for (size_t k = start_cut; k < chars.size() && k - start_cut < take; ++k) unicode::append_utf8(out, chars[k]);
      t = std::move(out);
    }
  }
  // Strip cuts the text's ends (after Fuse, the whole text): nothing of a token mid-text.
  void raw_piece(std::string&) const override {}

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const json& pattern, std::string content, const std::string& where) : content_(std::move(content)) {
    if (pattern.contains("String"))
      regex_.emplace(pattern["String"].get<std::string>(), true);
    else if (pattern.contains("Regex"))
      regex_.emplace(pattern["Regex"].get<std::string>(), false);
    else
      fail(ErrorCategory::kInvalidData, "{}: Replace decoder pattern must be {{\"String\"}} or {{\"Regex\"}}", where);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t pos = 0;
      regex_->for_each_match(t, [&](size_t start, size_t end) {
        out.append(t, pos, start - pos);
        out += content_;
        pos = end;
      });
      if (pos == 0) continue;
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }
  void raw_piece(std::string& t) const override {
    std::vector<std::string> one{std::move(t)};
    decode_chain(one);
    t = std::move(one[0]);
  }

 private:
  std::optional<Regex> regex_;
  std::string content_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }
  void raw_piece(std::string& t) const override {
    for (const auto& step : steps_) step->raw_piece(t);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme")) strip_first = j["prepend_scheme"].get<std::string>() != "never";
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", "\xE2\x96\x81"), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = j.value("content", " ");
    size_t i = 0;
    const char32_t c = content.empty() ? U' ' : unicode::next_char(content, i);
    return std::make_unique<StripDecoder>(c, j.value("start", size_t{0}), j.value("stop", size_t{0}));
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j.at("pattern"), j.value("content", ""), where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const json& step : j.at("decoders"))
      if (auto d = make_decoder(step, where)) steps.push_back(std::move(d));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  fail(ErrorCategory::kUnsupported, "{}: decoder type \"{}\" is not supported", where, type);
}

}  // namespace kettle::tok
