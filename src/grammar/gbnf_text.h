// Writing GBNF text: quoted literals, code-point classes, and the rules of "any text
// that does not contain a given string" (what a reasoning block before a constrained
// answer is).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace kettle::grammar {

// `text` (UTF-8) as a GBNF string literal.
std::string gbnf_quote(std::string_view text);
// The code points in `ranges` as a GBNF class ("[...]"); the ranges must not be empty.
std::string gbnf_class(const std::vector<CodePointRange>& ranges);
// Rules `name ::= ...` (with helpers named after it) matching any text that does not
// contain `stop` (which must not be empty), one line per rule.
std::string gbnf_text_without(const std::string& name, std::string_view stop);

}  // namespace kettle::grammar
