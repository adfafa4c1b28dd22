// Lexing and parsing: whitespace control as transformers configures Jinja,
// and syntax / unsupported-feature errors that name the template line.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "chat/lexer.h"
#include "util/error.h"

namespace kettle {
namespace {

std::string render(const std::string& source) {
  return ChatTemplate::from_source(source).render(nlohmann::ordered_json::array(), nullptr, false);
}

// The error a template raises when compiled: category and message.
Error compile_error(const std::string& source) {
  try {
    ChatTemplate::from_source(source);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error compiling: " << source;
  return Error(ErrorCategory::kInternal, "");
}

TEST(ChatLexer, TokensCarryTheirSourceLine) {
  const auto tokens = jinja::tokenize("a\nb {{ x }}\n\n{% if y %}z{% endif %}");
  ASSERT_GE(tokens.size(), 4u);
  EXPECT_EQ(tokens[0].type, jinja::TokenType::kText);
  EXPECT_EQ(tokens[1].type, jinja::TokenType::kOpenExpression);
  EXPECT_EQ(tokens[1].line, 2);
  EXPECT_EQ(tokens[2].value, "x");
  bool saw_if = false;
  for (const auto& t : tokens)
    if (t.value == "if") {
      saw_if = true;
      EXPECT_EQ(t.line, 4);
    }
  EXPECT_TRUE(saw_if);
}

TEST(ChatLexer, NegativeNumbersAndBinaryMinus) {
  EXPECT_EQ(render("{{ [1, 2, 3][-1] }} {{ 5 -2 }} {{ -2.5 }} {{ 3- -1 }}"), "3 3 -2.5 4");
}

TEST(ChatWhitespace, TrimBlocksAndLstripBlocks) {
  // trim_blocks drops the newline after a tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  // lstrip_blocks does not apply to {{ }}; a single trailing newline is dropped.
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");
  EXPECT_EQ(render("{# note #}\nline"), "line");
}

TEST(ChatWhitespace, DashesStripAroundTags) {
  EXPECT_EQ(render("a \n {%- if true -%} \n b \n {%- endif -%} \n c"), "abc");
  EXPECT_EQ(render("x   {{- 'y' -}}   z"), "xyz");
  EXPECT_EQ(render("x  {#- gone -#}  y"), "xy");
}

TEST(ChatWhitespace, GenerationTagsVanish) {
  EXPECT_EQ(render("[{% generation %}body{% endgeneration %}]"), "[body]");
  EXPECT_EQ(render("[ {%- generation -%} body {%- endgeneration -%} ]"), "[body]");
}

TEST(ChatWhitespace, RawBlocksAreText) {
  EXPECT_EQ(render("{% raw %}{{ not parsed }} {% if %}{% endraw %}!"), "{{ not parsed }} {% if %}!");
}

TEST(ChatSyntax, ErrorsNameTheLine) {
  const Error e = compile_error("line1\nline2 {{ x + }}\n");
  EXPECT_EQ(e.category(), ErrorCategory::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();

  const Error unclosed = compile_error("{% for m in messages %}\nx\n");
  EXPECT_NE(std::string(unclosed.what()).find("line 1"), std::string::npos) << unclosed.what();
  EXPECT_NE(std::string(unclosed.what()).find("for"), std::string::npos) << unclosed.what();

  const Error bad_char = compile_error("\n\n{{ a ! b }}");
  EXPECT_NE(std::string(bad_char.what()).find("line 3"), std::string::npos) << bad_char.what();

  const Error comment = compile_error("x {# never closed");
  EXPECT_NE(std::string(comment.what()).find("comment"), std::string::npos) << comment.what();
}

TEST(ChatSyntax, LineNumbersSurviveWhitespaceRewrites) {
  // trim_blocks removes newlines before the error; the line is still the author's.
  const Error e = compile_error("{% if a %}\n{% endif %}\n{% if b %}\n{{ c ) }}\n{% endif %}");
  EXPECT_NE(std::string(e.what()).find("line 4"), std::string::npos) << e.what();
}

TEST(ChatSyntax, UnsupportedFeaturesAreNamedWithTheirLine) {
  const Error include = compile_error("a\n{% include 'x.jinja' %}");
  EXPECT_EQ(include.category(), ErrorCategory::kUnsupported);
  EXPECT_NE(std::string(include.what()).find("line 2"), std::string::npos) << include.what();
  EXPECT_NE(std::string(include.what()).find("include"), std::string::npos) << include.what();

  const Error filter = compile_error("\n\n{{ x | xmlattr }}");
  EXPECT_EQ(filter.category(), ErrorCategory::kUnsupported);
  EXPECT_NE(std::string(filter.what()).find("line 3"), std::string::npos) << filter.what();
  EXPECT_NE(std::string(filter.what()).find("xmlattr"), std::string::npos) << filter.what();

  const Error test = compile_error("{{ x is sameas_nothing }}");
  EXPECT_EQ(test.category(), ErrorCategory::kUnsupported);
  EXPECT_NE(std::string(test.what()).find("sameas_nothing"), std::string::npos) << test.what();

  EXPECT_EQ(compile_error("{% extends 'base' %}").category(), ErrorCategory::kUnsupported);
  EXPECT_EQ(compile_error("{% block x %}{% endblock %}").category(), ErrorCategory::kUnsupported);
}

TEST(ChatSyntax, UnknownStatementIsASyntaxError) {
  const Error e = compile_error("{% endfor %}");
  EXPECT_EQ(e.category(), ErrorCategory::kInvalidData);
}

}  // namespace
}  // namespace kettle
