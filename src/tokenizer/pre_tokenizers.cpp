// tokenizer.json pre-tokenizers: Split (all five delimiter behaviours, invert),
// ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation,
// CharDelimiterSplit and Sequence, following HF's NormalizedString::split rules.
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "tokenizer/components.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle::tok {
namespace {

using nlohmann::json;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail(ErrorCategory::kInvalidData, "{}: unknown split behavior \"{}\"", where, name);
}

struct Span {
  uint32_t begin, end;  // piece-local byte offsets
  bool is_match;
};

// HF's SplitDelimiterBehavior applied to spans that cover the piece in order;
// empty results are dropped as PreTokenizedString::split does.
void emit_split(const Piece& p, std::vector<Span>& spans, Behavior behavior, std::vector<Piece>& out) {
  auto push = [&](uint32_t b, uint32_t e) {
    if (e > b) out.push_back(Piece{p.begin + b, p.begin + e, -1, p.at_start && b == 0});
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& s : spans) push(s.begin, s.end);
      return;
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) push(s.begin, s.end);
      return;
    case Behavior::kMergedWithPrevious: {
      // A match joins the span before it unless that span was itself a match.
      std::vector<Span> acc;
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !acc.empty())
          acc.back().end = s.end;
        else
          acc.push_back(s);
        previous_match = s.is_match;
      }
      for (const Span& s : acc) push(s.begin, s.end);
      return;
    }
    case Behavior::kMergedWithNext: {
      std::vector<Span> acc;
      bool previous_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.is_match && !previous_match && !acc.empty())
          acc.back().begin = s.begin;
        else
          acc.push_back(s);
        previous_match = s.is_match;
      }
      for (size_t k = acc.size(); k-- > 0;) push(acc[k].begin, acc[k].end);
      return;
    }
    case Behavior::kContiguous: {
      std::vector<Span> acc;
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !acc.empty())
          acc.back().end = s.end;
        else
          acc.push_back(s);
        previous_match = s.is_match;
      }
      for (const Span& s : acc) push(s.begin, s.end);
      return;
    }
  }
}

// Runs fn(list, piece, out) over every piece that is not an added token.
template <typename F>
void for_each_piece(PieceList& list, F&& fn) {
  std::vector<Piece> out;
  out.reserve(list.pieces.size() * 2 + 4);
  for (const Piece& p : list.pieces) {
    if (p.added_id >= 0)
      out.push_back(p);
    else
      fn(list, p, out);
  }
  list.pieces.swap(out);
}

void regex_spans(const Regex& re, std::string_view s, bool invert, std::vector<Span>& spans) {
  spans.clear();
  uint32_t prev = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, static_cast<uint32_t>(b), invert});
    spans.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e), !invert});
    prev = static_cast<uint32_t>(e);
  });
  if (prev < s.size()) spans.push_back({prev, static_cast<uint32_t>(s.size()), invert});
}

// HF's `impl Pattern for Fn(char) -> bool`: every matching char is its own match.
template <typename Pred>
void char_spans(std::string_view s, Pred&& pred, std::vector<Span>& spans) {
  spans.clear();
  uint32_t last = 0;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint32_t>(i);
    const char32_t c = unicode::next_char(s, i);
    if (pred(c)) {
      if (last < b) spans.push_back({last, b, false});
      spans.push_back({b, static_cast<uint32_t>(i), true});
      last = static_cast<uint32_t>(i);
    }
  }
  if (last < s.size()) spans.push_back({last, static_cast<uint32_t>(s.size()), false});
}

class Split : public PreTokenizer {
 public:
  Split(Regex re, Behavior behavior, bool invert) : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(PieceList& list) const override {
    std::vector<Span> spans;
    for_each_piece(list, [&](PieceList& l, const Piece& p, std::vector<Piece>& out) {
      regex_spans(re_, l.view(p), invert_, spans);
      emit_split(p, spans, behavior_, out);
    });
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class CharSplit : public PreTokenizer {
 public:
  CharSplit(std::function<bool(char32_t)> pred, Behavior behavior) : pred_(std::move(pred)), behavior_(behavior) {}
  void pre_tokenize(PieceList& list) const override {
    std::vector<Span> spans;
    for_each_piece(list, [&](PieceList& l, const Piece& p, std::vector<Piece>& out) {
      char_spans(l.view(p), pred_, spans);
      emit_split(p, spans, behavior_, out);
    });
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

// The GPT-2 pattern ByteLevel uses when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, bool map_bytes)
      : add_prefix_space_(add_prefix_space), map_bytes_(map_bytes) {
    if (use_regex) re_.emplace(kGpt2Pattern, false);
  }
  void pre_tokenize(PieceList& list) const override {
    std::vector<Span> spans;
    std::string tmp;
    for_each_piece(list, [&](PieceList& l, const Piece& in, std::vector<Piece>& out) {
      Piece p = in;
      if (add_prefix_space_ && l.text[p.begin] != ' ') {
        // Copy first: appending to l.text may move the bytes the piece views.
        tmp.assign(l.view(p));
        p.begin = static_cast<uint32_t>(l.text.size());
        l.text.push_back(' ');
        l.text += tmp;
        p.end = static_cast<uint32_t>(l.text.size());
      }
      const size_t first = out.size();
      if (re_) {
        regex_spans(*re_, l.view(p), false, spans);
        emit_split(p, spans, Behavior::kIsolated, out);
      } else {
        out.push_back(p);
      }
      if (!map_bytes_) return;
      for (size_t k = first; k < out.size(); ++k) {
        tmp.clear();
        for (char c : l.view(out[k])) tmp += byte_to_unicode(static_cast<unsigned char>(c));
        out[k].begin = static_cast<uint32_t>(l.text.size());
        l.text += tmp;
        out[k].end = static_cast<uint32_t>(l.text.size());
      }
    });
  }

 private:
  bool add_prefix_space_;
  bool map_bytes_;
  std::optional<Regex> re_;
};

enum class PrependScheme { kFirst, kAlways, kNever };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t i = 0;
    replacement_char_ = unicode::next_char(replacement_, i);
  }
  void pre_tokenize(PieceList& list) const override {
    std::vector<Span> spans;
    std::string tmp;
    for_each_piece(list, [&](PieceList& l, const Piece& in, std::vector<Piece>& out) {
      const std::string_view s = l.view(in);
      tmp.clear();
      const bool starts_with_replacement = s.starts_with(replacement_) || (s[0] == ' ');
      if (!starts_with_replacement &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && in.at_start)))
        tmp += replacement_;
      for (char c : s) {
        if (c == ' ')
          tmp += replacement_;
        else
          tmp += c;
      }
      Piece p = in;
      p.begin = static_cast<uint32_t>(l.text.size());
      l.text += tmp;
      p.end = static_cast<uint32_t>(l.text.size());
      if (!split_) {
        out.push_back(p);
        return;
      }
      const char32_t r = replacement_char_;
      char_spans(
          l.view(p), [r](char32_t c) { return c == r; }, spans);
      emit_split(p, spans, Behavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;
  char32_t replacement_char_ = 0;
  PrependScheme scheme_;
  bool split_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(PieceList& list) const override {
    for (const auto& step : steps_) step->pre_tokenize(list);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Regex pattern_regex(const json& pattern, const std::string& where) {
  if (pattern.contains("String")) return Regex(pattern["String"].get<std::string>(), true);
  if (pattern.contains("Regex")) return Regex(pattern["Regex"].get<std::string>(), false);
  fail(ErrorCategory::kInvalidData, "{}: Split pattern must be {{\"String\"}} or {{\"Regex\"}}", where);
}

std::unique_ptr<PreTokenizer> make_one(const json& j, const std::string& where, bool map_bytes) {
  const std::string type = j.value("type", "");
  if (type == "Split") {
    return std::make_unique<Split>(pattern_regex(j.at("pattern"), where),
                                   parse_behavior(j.value("behavior", "Isolated"), where), j.value("invert", false));
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true), map_bytes);
  if (type == "Metaspace") {
    std::string replacement = j.value("replacement", "\xE2\x96\x81");
    PrependScheme scheme = PrependScheme::kAlways;
    if (j.contains("prepend_scheme")) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      scheme = s == "first" ? PrependScheme::kFirst : s == "never" ? PrependScheme::kNever : PrependScheme::kAlways;
    } else if (!j.value("add_prefix_space", true)) {
      scheme = PrependScheme::kNever;
    }
    return std::make_unique<Metaspace>(std::move(replacement), scheme, j.value("split", true));
  }
  if (type == "Digits") {
    const bool individual = j.value("individual_digits", false);
    return std::make_unique<CharSplit>(unicode::is_numeric, individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Whitespace") {
    // HF: split on Invert(\w+|[^\w\s]+) with Removed, i.e. keep the matches.
    return std::make_unique<Split>(Regex(R"([\p{L}\p{M}\p{Nd}\p{Pc}]+|[^\p{L}\p{M}\p{Nd}\p{Pc}\s]+)", false),
                                   Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") return std::make_unique<CharSplit>(unicode::is_whitespace, Behavior::kRemoved);
  if (type == "Punctuation")
    return std::make_unique<CharSplit>(unicode::is_punctuation, parse_behavior(j.value("behavior", "Isolated"), where));
  if (type == "CharDelimiterSplit") {
    const std::string d = j.at("delimiter").get<std::string>();
    size_t i = 0;
    const char32_t delim = unicode::next_char(d, i);
    return std::make_unique<CharSplit>([delim](char32_t c) { return c == delim; }, Behavior::kRemoved);
  }
  fail(ErrorCategory::kUnsupported, "{}: pre-tokenizer type \"{}\" is not supported", where, type);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where, bool allow_defer_byte_level,
                                                 bool& deferred_byte_level) {
  deferred_byte_level = false;
  if (j.is_null()) return nullptr;
  // Flatten nested sequences so "the last step" is well defined.
  std::vector<const json*> flat;
  std::function<void(const json&)> collect = [&](const json& node) {
    if (node.value("type", "") == "Sequence") {
      for (const json& sub : node.at("pretokenizers")) collect(sub);
    } else {
      flat.push_back(&node);
    }
  };
  collect(j);
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  for (size_t k = 0; k < flat.size(); ++k) {
    const bool last_byte_level = k + 1 == flat.size() && flat[k]->value("type", "") == "ByteLevel";
    const bool defer = allow_defer_byte_level && last_byte_level;
    if (defer) deferred_byte_level = true;
    steps.push_back(make_one(*flat[k], where, !defer));
  }
  if (steps.size() == 1) return std::move(steps[0]);
  return std::make_unique<Sequence>(std::move(steps));
}

}  // namespace kettle::tok
