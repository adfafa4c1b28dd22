// A regular expression (the ECMAScript / Python common subset) → GBNF rules.
// Supported: literals and escapes (\d \w \s and their negations, \n \t \r \f \v,
// \xHH, \uHHHH, escaped punctuation), `.`, classes with ranges and negation,
// groups ((...), (?:...), (?<name>...)), alternation, and the quantifiers * + ?
// {m} {m,} {m,n} (lazy forms match the same language). Anchors ^ and $ are allowed
// at the ends of the top-level branches. Backreferences, lookaround and word
// boundaries are not regular and are refused, naming what was found.
#pragma once

#include <string>
#include <string_view>

namespace kettle::grammar {

enum class RegexMode {
  kFullMatch,   // the whole text matches (guided_regex)
  kJsonString,  // the inside of a JSON string, escaped as JSON writes it; unanchored
                // ends match anything (JSON Schema's "pattern" searches)
};

// Rules whose start rule is `name`. `any_char_rule`, in kJsonString mode: a rule
// matching one JSON string character (for the unanchored ends). Throws
// kettle::Error (kInvalidArgument) naming the problem and its offset.
std::string regex_to_gbnf(std::string_view pattern, const std::string& name, RegexMode mode,
                          const std::string& any_char_rule = {});

}  // namespace kettle::grammar
