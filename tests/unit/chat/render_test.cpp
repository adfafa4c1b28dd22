// The interpreter: statements, operators, value printing, filters, tests and
// methods, with expected strings taken from @huggingface/jinja 0.5.11 (and
// Python Jinja where kettle follows it on purpose).
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "util/error.h"

namespace kettle {
namespace {

using Json = nlohmann::ordered_json;

const Json kMessages = Json::parse(R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Héllo"},
  {"role": "assistant", "content": "Hi"},
  {"role": "user", "content": "Bye"}
])");

std::string render(const std::string& source, const Json& extra = Json::object(), const Json& tools = nullptr) {
  return ChatTemplate::from_source(source, Json{{"bos_token", "<s>"}}).render(kMessages, tools, true, extra);
}

TEST(ChatRender, VariablesTransformersPasses) {
  EXPECT_EQ(render("{{ bos_token }}{{ add_generation_prompt }}{{ messages | length }}"), "<s>true4");
  // transformers passes tools and documents always, None when absent.
  EXPECT_EQ(render("{{ tools is none }} {{ documents is none }}"), "true true");
  EXPECT_EQ(render("{{ tools | length }}", Json::object(), Json::array({Json::object()})), "1");
  EXPECT_EQ(
      render("{{ enable_thinking }} {{ date_string }}", Json{{"enable_thinking", false}, {"date_string", "1 Jan"}}),
      "false 1 Jan");
}

TEST(ChatRender, ForLoopVariables) {
  EXPECT_EQ(
      render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }},{% endfor %}"),
      "10truefalse,21falsefalse,32falsefalse,43falsetrue,");
  EXPECT_EQ(
      render(
          "{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}{{ m.content }} {% endfor %}"),
      "1/2Héllo 2/2Bye ");
  EXPECT_EQ(render("{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }} {% endfor %}"),
            "- system user assistant ");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}"), "uaus");
  EXPECT_EQ(render("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
}

TEST(ChatRender, BreakAndContinueKeepOutputWrittenBefore) {
  // Jinja keeps "2" written before {% break %} (the reference engine drops it).
  EXPECT_EQ(render("{% for i in range(5) %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endfor %}"), "012");
  EXPECT_EQ(render("{% for i in range(4) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}"), "02");
}

TEST(ChatRender, SetNamespaceAndScopes) {
  EXPECT_EQ(
      render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"),
      "4");
  // A plain set inside a loop does not leak out of it.
  EXPECT_EQ(render("{% set x = 'out' %}{% for m in messages %}{% set x = 'in' %}{% endfor %}{{ x }}"), "out");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set s %}[{{ messages[1].content }}]{% endset %}{{ s | upper }}"), "[HÉLLO]");
}

TEST(ChatRender, MacrosCallerAndFilterBlocks) {
  EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(a=3, b=4) }}"),
            "1B1234");
  EXPECT_EQ(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
}

TEST(ChatRender, OperatorsFollowTheReference) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ 7 / 2 }} {{ 6 / 2 }}"),
            "3 -4 -1 64 3.5 3.0");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ true }} {{ 'n' + 1 }} {{ 1 == 1.0 }} {{ '1' == 1 }}"), "a1true n1 true true");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 3 not in [1, 2] }} {{ 'role' in messages[0] }} {{ 'x' in nothing }}"),
            "true true true false");
  EXPECT_EQ(render("{{ 'yes' if messages else 'no' }}{{ 'never' if false }}|{{ [] or 'empty' }}"), "yes|empty");
  EXPECT_EQ(render("{{ '=' * 3 }}"), "===");
}

TEST(ChatRender, ValuesPrintLikeTheReference) {
  EXPECT_EQ(render("{{ true }}|{{ none }}|{{ nothing }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ -0.0 }}"),
            "true|||1.0|0.30000000000000004|-0.0");
  EXPECT_EQ(render("{{ [1, 'a', none, 1.5] }} {{ {'k': {'n': true}} }}"),
            "[1, \"a\", null, 1.5] {\"k\": {\"n\": true}}");
  EXPECT_EQ(render("{{ 1000000000000000000000.0 * 10 }} {{ 0.00000015 }}"), "1e+22 1.5e-7");
}

TEST(ChatRender, UndefinedIsLenient) {
  EXPECT_EQ(render("[{{ nothing }}{{ nothing.attr }}{{ messages[0].missing }}]"), "[]");
  EXPECT_EQ(render("{{ nothing is defined }} {{ nothing | default('d') }} {{ nothing ~ 'x' }}"), "false d x");
  EXPECT_THROW(render("{{ nothing + 1 }}"), Error);
  EXPECT_THROW(render("{{ nothing() }}"), Error);
}

TEST(ChatRender, StringMethods) {
  EXPECT_EQ(
      render(
          "{{ '  a  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\n a\\n'.lstrip('\\n') }}|{{ 'ab\\n'.rstrip() }}|"),
      "a|a| a\n|ab|");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }}"),
            "[\"a\", \"b\", \"\", \"c\"] [\"a\", \"b\"] [\"a\", \"b-c\"]");
  EXPECT_EQ(
      render("{{ 'straße'.upper() }} {{ 'ÉCOLE'.lower() }} {{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() }}"),
      "STRASSE école Hello WORLD HELLO");
  EXPECT_EQ(
      render("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'x.py'.endswith(('.js', '.py')) }} {{ 'abc'.startswith('b') }}"),
      "bba true false");
  EXPECT_EQ(render("{{ 'héllo'.find('l') }} {{ 'banana'.count('a') }} {{ '-'.join(['a', 'b']) }}"), "2 3 a-b");
}

TEST(ChatRender, ListAndDictMethods) {
  EXPECT_EQ(render("{% set l = [1] %}{% set _ = l.append(2) %}{{ l }} {{ l.pop() }} {{ l }}"), "[1, 2] 2 [1]");
  EXPECT_EQ(render("{{ messages[0].get('role') }} {{ messages[0].get('x', 'd') }} {{ messages[0].keys() | list }}"),
            "system d [\"role\", \"content\"]");
}

TEST(ChatRender, Filters) {
  EXPECT_EQ(render("{{ {'b': [1, {'c': null}], 'é': 'ü'} | tojson }}"), "{\"b\": [1, {\"c\": null}], \"é\": \"ü\"}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ {'é': 1} | tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"),
            "{\"\\u00e9\": 1} {\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render("{{ messages | map(attribute='role') | join(',') }}"), "system,user,assistant,user");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}"),
            "[\"Héllo\", \"Bye\"]");
  EXPECT_EQ(render("{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}"), "2");
  EXPECT_EQ(render("{{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2, 2] | unique | list }}"),
            "[\"A\", \"b\", \"c\"] [3, 2, 1] [1, 2]");
  EXPECT_EQ(render("{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'héllo' | length }}{{ [1, 2] | count }}"), "1352");
  EXPECT_EQ(render("{{ '  t  ' | trim }}|{{ 'a\\nb' | indent(2) }}|{{ 'x' | upper }}{{ 'Y' | lower }}"), "t|a\n  b|Xy");
  EXPECT_EQ(
      render("{{ '12ab' | int }} {{ 'x' | int }} {{ 3.7 | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 4 | string }}"),
      "12 0 3 2.5 3 4");
  EXPECT_EQ(render("{{ '' | default('e', true) }} {{ {'b': 1, 'a': 2} | dictsort }} {{ {'a': 1} | items | list }}"),
            "e [[\"a\", 2], [\"b\", 1]] [[\"a\", 1]]");
  EXPECT_EQ(render("{{ [1, 2, 3] | map('string') | join('+') }} {{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, "
                   "3] | sum }}"),
            "1+2+3 [2, 4] 6");
}

TEST(ChatRender, Tests) {
  EXPECT_EQ(render("{{ 1 is number }}{{ true is number }}{{ 'a' is string }}{{ none is none }}{{ {} is mapping }}"),
            "truefalsetruetruetrue");
  EXPECT_EQ(render("{{ [] is iterable }}{{ {} is iterable }}{{ 3 is odd }}{{ 1.5 is float }}{{ 9 is divisibleby 3 }}"),
            "truefalsetruetruetrue");
  EXPECT_EQ(render("{{ 2 is in [1, 2] }}{{ 'A' is upper }}{{ x is undefined }}{{ 1 is not string }}"),
            "truetruetruetrue");
}

TEST(ChatRender, RaiseExceptionPassesTheMessageThrough) {
  try {
    render(
        "{% if messages | length > 1 %}{{ raise_exception('Conversation roles must alternate user/assistant!') }}{% "
        "endif %}");
    FAIL() << "expected raise_exception to throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant!");
  }
}

TEST(ChatRender, RuntimeErrorsNameTheLine) {
  try {
    render("line 1\n{% for m in messages %}\n{{ m.content - 1 }}\n{% endfor %}");
    FAIL() << "expected a render error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(ChatRender, KeyOrderOfTheInputIsKept) {
  const Json tools =
      Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])");
  EXPECT_EQ(render("{{ tools[0] | tojson }}", Json::object(), tools),
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"z\": 1, \"a\": 2}}}");
}

TEST(ChatRender, StrftimeNowFormatsTheLocalDate) {
  const std::string out = render("{{ strftime_now('%Y-%m-%d|%d %b %Y|%B|%%') }}");
  ASSERT_EQ(out.size() >= 22u, true) << out;
  EXPECT_EQ(out[4], '-');
  EXPECT_EQ(out[10], '|');
  EXPECT_NE(out.find("|%"), std::string::npos) << out;
}

}  // namespace
}  // namespace kettle
