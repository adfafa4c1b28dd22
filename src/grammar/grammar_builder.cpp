// GrammarBuilder: rules, literals, code-point classes as UTF-8 byte sequences,
// repetitions as right-recursive helpers, and the checks finish() makes.
#include <algorithm>

#include "grammar/grammar.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

int utf8_length(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void encode(char32_t c, uint8_t* out) {
  const int n = utf8_length(c);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(c);
    return;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    c >>= 6;
  }
  out[0] = static_cast<uint8_t>((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | c);
}

// [lo, hi] as sequences of byte ranges, each sequence one UTF-8 length and each of its
// positions a contiguous range (the classic split of utf8-ranges).
void utf8_sequences(char32_t lo, char32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  for (char32_t edge : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
    if (lo <= edge && edge < hi) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

// Sorted, merged, surrogates removed; negated: the complement over all scalar values.
std::vector<CodePointRange> normalize(std::vector<CodePointRange> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end(), [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  std::vector<CodePointRange> merged;
  for (CodePointRange r : ranges) {
    r.hi = std::min(r.hi, kMaxCodePoint);
    if (r.lo > r.hi) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1)
      merged.back().hi = std::max(merged.back().hi, r.hi);
    else
      merged.push_back(r);
  }
  if (negated) {
    std::vector<CodePointRange> complement;
    char32_t next = 0;
    for (const CodePointRange& r : merged) {
      if (r.lo > next) complement.push_back({next, r.lo - 1});
      next = r.hi + 1;
    }
    if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
    merged = std::move(complement);
  }
  std::vector<CodePointRange> out;
  for (const CodePointRange& r : merged) {
    if (r.hi < 0xD800 || r.lo > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.lo < 0xD800) out.push_back({r.lo, 0xD7FF});
    if (r.hi > 0xDFFF) out.push_back({0xE000, r.hi});
  }
  return out;
}

}  // namespace

void GrammarBuilder::count(size_t n) {
  elements_ += n;
  if (elements_ > kMaxElements)
    fail(ErrorCategory::kInvalidArgument, "the grammar is too large: more than {} elements once its repetitions are "
         "expanded", kMaxElements);
}

int32_t GrammarBuilder::rule(std::string_view name) {
  if (auto it = by_name_.find(std::string(name)); it != by_name_.end()) return it->second;
  const auto id = static_cast<int32_t>(names_.size());
  names_.emplace_back(name);
  alternatives_.emplace_back();
  defined_.push_back(false);
  by_name_.emplace(std::string(name), id);
  return id;
}

int32_t GrammarBuilder::helper(std::string_view base) {
  std::string name;
  do name = fmt::format("{}-{}", base, ++helpers_);
  while (by_name_.contains(name));
  return rule(name);
}

void GrammarBuilder::add(int32_t rule, Sequence alternative) {
  count(alternative.size() + 1);
  alternatives_[static_cast<size_t>(rule)].push_back(std::move(alternative));
  defined_[static_cast<size_t>(rule)] = true;
}

Element GrammarBuilder::bytes(const ByteSet& set) {
  for (size_t i = 0; i < byte_sets_.size(); ++i)
    if (byte_sets_[i] == set) return {Element::kBytes, static_cast<int32_t>(i)};
  byte_sets_.push_back(set);
  return {Element::kBytes, static_cast<int32_t>(byte_sets_.size() - 1)};
}

GrammarBuilder::Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence seq;
  for (char c : text) {
    ByteSet set;
    set.add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
    seq.push_back(bytes(set));
  }
  return seq;
}

Element GrammarBuilder::code_points(std::vector<CodePointRange> ranges, bool negated) {
  const std::vector<CodePointRange> set = normalize(std::move(ranges), negated);
  ByteSet ascii;
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> multi;
  for (const CodePointRange& r : set) {
    if (r.lo < 0x80) ascii.add(static_cast<uint8_t>(r.lo), static_cast<uint8_t>(std::min<char32_t>(r.hi, 0x7F)));
    if (r.hi >= 0x80) utf8_sequences(std::max<char32_t>(r.lo, 0x80), r.hi, multi);
  }
  if (multi.empty() && !ascii.empty()) return bytes(ascii);
  const int32_t id = helper("char");
  if (!ascii.empty()) add(id, {bytes(ascii)});
  for (const auto& seq : multi) {
    Sequence alt;
    for (auto [lo, hi] : seq) {
      ByteSet b;
      b.add(lo, hi);
      alt.push_back(bytes(b));
    }
    add(id, std::move(alt));
  }
  if (set.empty()) fail(ErrorCategory::kInvalidArgument, "a character class matches no character");
  return ref(id);
}

Element GrammarBuilder::group(const Sequence& seq) {
  if (seq.size() == 1) return seq[0];
  const int32_t id = helper("group");
  add(id, seq);
  return ref(id);
}

Element GrammarBuilder::repeat(const Sequence& item, int min, int max) {
  if (min < 0 || (max >= 0 && max < min))
    fail(ErrorCategory::kInvalidArgument, "a repetition {{{},{}}} has its bounds the wrong way round", min, max);
  if (min > kMaxRepeat || max > kMaxRepeat)
    fail(ErrorCategory::kInvalidArgument, "a repetition count above {} is not supported", kMaxRepeat);
  const Element x = group(item);
  // The tail after the min required copies: x* (tail-recursive) or nested optionals.
  int32_t tail = -1;
  if (max < 0) {
    tail = helper("star");
    add(tail, {x, ref(tail)});
    add(tail, {});
  } else {
    for (int k = 0; k < max - min; ++k) {
      const int32_t opt = helper("opt");
      if (tail < 0)
        add(opt, {x});
      else
        add(opt, {x, ref(tail)});
      add(opt, {});
      tail = opt;
    }
  }
  Sequence seq(static_cast<size_t>(min), x);
  if (tail >= 0) seq.push_back(ref(tail));
  if (seq.empty()) {
    const int32_t empty = helper("empty");
    add(empty, {});
    return ref(empty);
  }
  return group(seq);
}

Grammar GrammarBuilder::finish(std::string_view root) {
  const auto n = alternatives_.size();
  auto found = by_name_.find(std::string(root));
  if (found == by_name_.end() || !defined_[static_cast<size_t>(found->second)])
    fail(ErrorCategory::kInvalidArgument, "the grammar has no '{}' rule to start from", root);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& alt : alternatives_[r])
      for (const Element& e : alt)
        if (e.kind == Element::kRule && !defined_[static_cast<size_t>(e.value)])
          fail(ErrorCategory::kInvalidArgument, "rule '{}' uses '{}', which is not defined", names_[r],
               names_[static_cast<size_t>(e.value)]);

  // Nullable rules (they can match nothing), to the fixed point.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : alternatives_[r]) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::kRule && nullable[static_cast<size_t>(e.value)];
        });
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a rule reachable from itself through leftmost positions (after nullables).
  std::vector<std::vector<int32_t>> leftmost(n);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& alt : alternatives_[r])
      for (const Element& e : alt) {
        if (e.kind != Element::kRule) break;
        leftmost[r].push_back(e.value);
        if (!nullable[static_cast<size_t>(e.value)]) break;
      }
  // Depth-first with an explicit stack (grammars may chain many thousands of rules).
  std::vector<uint8_t> mark(n, 0);  // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // rule, next leftmost edge to follow
  for (size_t start = 0; start < n; ++start) {
    if (mark[start] != 0) continue;
    path.emplace_back(static_cast<int32_t>(start), 0);
    mark[start] = 1;
    while (!path.empty()) {
      auto& [r, edge] = path.back();
      const std::vector<int32_t>& next = leftmost[static_cast<size_t>(r)];
      if (edge == next.size()) {
        mark[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t s = next[edge++];
      if (mark[static_cast<size_t>(s)] == 1)
        fail(ErrorCategory::kInvalidArgument, "rule '{}' is left-recursive (it can reach itself before matching "
             "anything); rewrite it with a repetition", names_[static_cast<size_t>(s)]);
      if (mark[static_cast<size_t>(s)] == 0) {
        mark[static_cast<size_t>(s)] = 1;
        path.emplace_back(s, 0);
      }
    }
  }

  Grammar g;
  g.byte_sets = byte_sets_;
  g.rule_names = names_;
  g.root = found->second;
  g.rules.resize(n);
  g.elements.reserve(elements_);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& alt : alternatives_[r]) {
      g.rules[r].push_back(static_cast<int32_t>(g.elements.size()));
      g.elements.insert(g.elements.end(), alt.begin(), alt.end());
      g.elements.push_back({Element::kEnd, 0});
    }
  return g;
}

}  // namespace kettle::grammar
