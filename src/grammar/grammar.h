// Grammar: a context-free grammar over bytes, what every constraint compiles to
// (GBNF text, a regular expression, a JSON schema, a list of choices, a tool
// call's shape). Rules are alternatives of elements; an element matches one byte
// from a set or expands another rule. Code-point classes are expanded into UTF-8
// byte sequences when built, so the matcher works on bytes, as tokens are.
//
// GrammarBuilder is how grammars are made: rules by name, literals, classes and
// bounded repetitions (each repetition a right-recursive helper rule, so matching a
// long run never deepens the matcher's stack). finish() checks that every rule used
// is defined and that no rule is left-recursive.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kettle::grammar {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1u; }
  void add(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: a byte set; kRule: a rule
  bool operator==(const Element&) const = default;
};

// The finished grammar: every alternative's elements laid end to end, each closed by kEnd.
struct Grammar {
  std::vector<Element> elements;
  std::vector<std::vector<int32_t>> rules;  // rule → the positions its alternatives start at
  std::vector<ByteSet> byte_sets;
  std::vector<std::string> rule_names;
  int32_t root = 0;
};

// An inclusive range of Unicode code points.
struct CodePointRange {
  char32_t lo, hi;
};

class GrammarBuilder {
 public:
  using Sequence = std::vector<Element>;

  // The rule called `name`, made (undefined) on first use.
  int32_t rule(std::string_view name);
  // A new helper rule named after `base`.
  int32_t helper(std::string_view base);
  // Adds an alternative to a rule and marks it defined (an empty sequence matches nothing: ε).
  void add(int32_t rule, Sequence alternative);
  bool defined(int32_t rule) const { return defined_[static_cast<size_t>(rule)]; }

  Element ref(int32_t rule) const { return {Element::kRule, rule}; }
  Element bytes(const ByteSet& set);
  // The UTF-8 bytes of `text`, one element each.
  Sequence literal(std::string_view text);
  // One code point in (or, negated, outside) the ranges: one element.
  Element code_points(std::vector<CodePointRange> ranges, bool negated);
  // `item` repeated min..max times (max < 0: no bound): one element.
  Element repeat(const Sequence& item, int min, int max);
  // A sequence as one element (itself when it has one element).
  Element group(const Sequence& seq);

  // Checks and flattens; `root` names the start rule. Throws kettle::Error
  // (kInvalidArgument) naming an undefined or left-recursive rule.
  Grammar finish(std::string_view root);

  // Bounds on what one grammar may hold (elements over all alternatives, one repetition's count).
  static constexpr size_t kMaxElements = 4u << 20;
  static constexpr int kMaxRepeat = 100000;

 private:
  void count(size_t n);

  std::vector<std::vector<Sequence>> alternatives_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, int32_t> by_name_;
  std::vector<ByteSet> byte_sets_;
  size_t elements_ = 0;
  int helpers_ = 0;
};

// GBNF text (llama.cpp's grammar format: `name ::= alternatives`, "literals",
// [classes], `.`, ( groups ), * + ? {m} {m,} {m,n}, # comments) → a grammar whose start
// rule is `root`. Errors name the line and column.
Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace kettle::grammar
