// Tokens → syntax tree for the chat-template Jinja subset, following
// @huggingface/jinja's grammar and precedence (tests bind tighter than `*`,
// `**` is left-associative, `in` sits with the comparisons).
#pragma once

#include <string_view>

#include "chat/ast.h"

namespace kettle::jinja {

// Throws kettle::Error: kInvalidData for syntax errors, kUnsupported for Jinja
// statements, filters or tests kettle does not implement; both name the line.
Body parse_template(std::string_view source);

}  // namespace kettle::jinja
