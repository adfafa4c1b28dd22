// OutputParser: realistic outputs of Qwen3, DeepSeek-R1, Hermes-style and
// Llama 3.x models → reasoning / content / tool calls; malformed and unclosed
// markup; and the streaming property that every split gives the same events.
#include "chat/output_parser.h"

#include <gtest/gtest.h>

#include <random>

#include "chat/chat_template.h"

namespace kettle {
namespace {

const OutputFormat kQwen3{ToolCallFormat::kHermes, true};
const OutputFormat kHermesOnly{ToolCallFormat::kHermes, false};
const OutputFormat kLlama3{ToolCallFormat::kLlama3Json, false};
const OutputFormat kReasoningOnly{ToolCallFormat::kNone, true};

OutputParserOptions opts(OutputFormat format, bool tools = true, bool in_reasoning = false) {
  return OutputParserOptions{format, tools, in_reasoning};
}

// Adjacent deltas of one kind merged, so outputs split differently compare equal.
std::vector<OutputEvent> normalized(const std::vector<OutputEvent>& events) {
  std::vector<OutputEvent> out;
  for (const auto& e : events) {
    if (!out.empty() && out.back().index() == e.index()) {
      if (auto* r = std::get_if<ReasoningDelta>(&out.back())) {
        r->text += std::get<ReasoningDelta>(e).text;
        continue;
      }
      if (auto* c = std::get_if<ContentDelta>(&out.back())) {
        c->text += std::get<ContentDelta>(e).text;
        continue;
      }
    }
    out.push_back(e);
  }
  return out;
}

std::vector<OutputEvent> parse_pieces(const OutputParserOptions& o, const std::vector<std::string>& pieces) {
  OutputParser parser(o);
  std::vector<OutputEvent> all;
  for (const auto& piece : pieces) {
    auto events = parser.push(piece);
    for (const auto& e : events) {
      // Empty deltas would be noise on the wire.
      if (auto* r = std::get_if<ReasoningDelta>(&e)) {
        EXPECT_FALSE(r->text.empty());
      }
      if (auto* c = std::get_if<ContentDelta>(&e)) {
        EXPECT_FALSE(c->text.empty());
      }
    }
    all.insert(all.end(), events.begin(), events.end());
  }
  auto tail = parser.finish();
  all.insert(all.end(), tail.begin(), tail.end());
  return normalized(all);
}

std::vector<OutputEvent> parse(const OutputParserOptions& o, const std::string& text) {
  return parse_pieces(o, {text});
}

std::string describe(const std::vector<OutputEvent>& events) {
  std::string s;
  for (const auto& e : events) {
    if (auto* r = std::get_if<ReasoningDelta>(&e)) s += "R[" + r->text + "] ";
    if (auto* c = std::get_if<ContentDelta>(&e)) s += "C[" + c->text + "] ";
    if (auto* t = std::get_if<ToolCall>(&e)) s += "T[" + t->name + " " + t->arguments + "] ";
  }
  return s;
}

#define EXPECT_EVENTS(actual, ...)                                                               \
  do {                                                                                           \
    std::vector<OutputEvent> expected_events{__VA_ARGS__};                                       \
    auto actual_events = (actual);                                                               \
    EXPECT_EQ(actual_events, expected_events) << "got:      " << describe(actual_events) << "\n" \
                                              << "expected: " << describe(expected_events);      \
  } while (0)

// ---- reasoning ---------------------------------------------------------------

TEST(OutputParser, Qwen3ThinkingThenAnswer) {
  EXPECT_EVENTS(parse(opts(kQwen3), "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is **4**."),
                ReasoningDelta{"The user wants 2+2. That is 4."}, ContentDelta{"The answer is **4**."});
}

TEST(OutputParser, Qwen3EmptyThinkBlockLeavesOnlyTheAnswer) {
  EXPECT_EVENTS(parse(opts(kQwen3), "<think>\n\n</think>\n\nHello! How can I help you today?"),
                ContentDelta{"Hello! How can I help you today?"});
}

TEST(OutputParser, Qwen3WithoutThinkingIsContent) {
  EXPECT_EVENTS(parse(opts(kQwen3), "Hello! How can I help you today?\n"),
                ContentDelta{"Hello! How can I help you today?\n"});
}

TEST(OutputParser, DeepSeekR1PromptOpensReasoning) {
  std::string prompt = "<｜begin▁of▁sentence｜><｜User｜>What is 7*6?<｜Assistant｜><think>\n";
  ASSERT_TRUE(prompt_opens_reasoning(prompt));
  auto o = opts(kReasoningOnly, false, prompt_opens_reasoning(prompt));
  EXPECT_EVENTS(parse(o, "Okay, 7 times 6.\n\nThat is 42.\n</think>\n\n**42**"),
                ReasoningDelta{"Okay, 7 times 6.\n\nThat is 42."}, ContentDelta{"**42**"});
}

TEST(OutputParser, PromptOpensReasoningOnlyWhenLastThinkIsOpen) {
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>a</think> then <think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

TEST(OutputParser, UnclosedReasoningStaysReasoning) {
  EXPECT_EVENTS(parse(opts(kQwen3), "<think>\nLet me think about this very long"),
                ReasoningDelta{"Let me think about this very long"});
  EXPECT_EVENTS(parse(opts(kQwen3), "<think>\nalmost done </thi"), ReasoningDelta{"almost done </thi"});
}

TEST(OutputParser, ThinkOnlyOpensReasoningAtTheStartOfTheAnswer) {
  EXPECT_EVENTS(parse(opts(kQwen3), "Use <think> tags like </think> this."),
                ContentDelta{"Use <think> tags like </think> this."});
  EXPECT_EVENTS(parse(opts(kQwen3), "<think>a</think>b<think>c</think>"), ReasoningDelta{"a"},
                ContentDelta{"b<think>c</think>"});
}

TEST(OutputParser, ReasoningOffLeavesThinkTagsAsContent) {
  EXPECT_EVENTS(parse(opts(kHermesOnly), "<think>x</think>y"), ContentDelta{"<think>x</think>y"});
}

TEST(OutputParser, ReasoningIsStreamedBeforeItCloses) {
  OutputParser p(opts(kQwen3));
  EXPECT_EVENTS(p.push("<thi"));
  EXPECT_EVENTS(p.push("nk>\nStep one"), ReasoningDelta{"Step one"});
  EXPECT_EVENTS(p.push(" done.\n"), ReasoningDelta{" done."});  // the newline waits: it may end the block
  EXPECT_EVENTS(p.push("</"));
  EXPECT_EVENTS(p.push("think>\n\nAnswer"), ContentDelta{"Answer"});
  EXPECT_EVENTS(p.finish());
}

// ---- Hermes / Qwen tool calls ---------------------------------------------------

TEST(OutputParser, Qwen3ThinkingThenToolCalls) {
  std::string out =
      "<think>\nI need the weather for both cities.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
      "</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"unit\": \"celsius\"}}\n"
      "</tool_call>";
  EXPECT_EVENTS(parse(opts(kQwen3), out), ReasoningDelta{"I need the weather for both cities."},
                ToolCall{"get_weather", R"({"city":"Paris","unit":"celsius"})"},
                ToolCall{"get_weather", R"({"city":"Tokyo","unit":"celsius"})"});
}

TEST(OutputParser, HermesContentThenSeveralCalls) {
  std::string out =
      "Sure, let me look both up.\n\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"kettle\", \"limit\": 3}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
  EXPECT_EVENTS(parse(opts(kHermesOnly), out), ContentDelta{"Sure, let me look both up."},
                ToolCall{"search", R"({"query":"kettle","limit":3})"}, ToolCall{"now", "{}"});
}

TEST(OutputParser, HermesCallIsEmittedWhenItCloses) {
  OutputParser p(opts(kHermesOnly));
  EXPECT_EVENTS(p.push("Checking.\n<tool_"), ContentDelta{"Checking."});
  EXPECT_EVENTS(p.push("call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool"));
  EXPECT_EVENTS(p.push("_call>"), ToolCall{"f", R"({"x":1})"});
  EXPECT_EVENTS(p.finish());
}

TEST(OutputParser, ArgumentsKeepKeyOrderAndNesting) {
  std::string out =
      "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"zeta\": 1, \"alpha\": {\"list\": [1, 2.5, null, true], "
      "\"s\": \"x\"}}}\n</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), out),
                ToolCall{"run", R"({"zeta":1,"alpha":{"list":[1,2.5,null,true],"s":"x"}})"});
}

TEST(OutputParser, BracesAndClosingMarkerInsideJsonStrings) {
  std::string out =
      "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.c\", \"text\": \"int main() { return 0; }"
      " // </tool_call> \\\"quoted\\\" \\\\\", \"meta\": {\"brace\": \"}\"}}}\n</tool_call>after";
  EXPECT_EVENTS(
      parse(opts(kHermesOnly), out),
      ToolCall{
          "write_file",
          R"({"path":"a.c","text":"int main() { return 0; } // </tool_call> \"quoted\" \\","meta":{"brace":"}"}})"},
      ContentDelta{"after"});
}

TEST(OutputParser, UnicodeInContentAndArguments) {
  std::string out =
      "Grüße 👋 — ich schaue nach.\n<tool_call>\n{\"name\": \"wetter\", \"arguments\": {\"stadt\": \"Zürich\", "
      "\"alt\": \"東京\", \"esc\": \"\\u00e9\"}}\n</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), out), ContentDelta{"Grüße 👋 — ich schaue nach."},
                ToolCall{"wetter", R"({"stadt":"Zürich","alt":"東京","esc":"é"})"});
}

TEST(OutputParser, ArgumentsGivenAsAJsonStringAreAccepted) {
  EXPECT_EVENTS(parse(opts(kHermesOnly), "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"),
                ToolCall{"f", R"({"a":1})"});
  EXPECT_EVENTS(parse(opts(kHermesOnly), "<tool_call>{\"name\": \"f\"}</tool_call>"), ToolCall{"f", "{}"});
}

TEST(OutputParser, MalformedCallBecomesContent) {
  std::string missing_brace = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), missing_brace), ContentDelta{missing_brace});
  std::string no_name = "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), "Hi." + no_name + "\n<tool_call>{\"name\":\"g\"}</tool_call>"),
                ContentDelta{"Hi." + no_name}, ToolCall{"g", "{}"});
  std::string not_json = "<tool_call>get_weather(city='Paris')</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), not_json), ContentDelta{not_json});
  std::string bad_args = "<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly), bad_args), ContentDelta{bad_args});
}

TEST(OutputParser, UnclosedCallIsParsedIfCompleteElseContent) {
  EXPECT_EVENTS(parse(opts(kHermesOnly), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}\n"),
                ToolCall{"f", R"({"a":"b"})"});
  EXPECT_EVENTS(parse(opts(kHermesOnly), "Let me\n<tool_call>\n{\"name\": \"f\", \"argu"),
                ContentDelta{"Let me<tool_call>\n{\"name\": \"f\", \"argu"});
  // An unterminated string swallows the closing marker; the text is still not lost.
  std::string odd = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"b}}</tool_call> tail";
  EXPECT_EVENTS(parse(opts(kHermesOnly), odd), ContentDelta{odd});
}

TEST(OutputParser, ToolMarkersWithoutToolsAreContent) {
  std::string out = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EVENTS(parse(opts(kHermesOnly, false), out), ContentDelta{out});
  std::string llama = "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}";
  EXPECT_EVENTS(parse(opts(kLlama3, false), llama), ContentDelta{llama});
  EXPECT_EVENTS(parse(opts(kQwen3, false), "<think>\nhm\n</think>\n\n" + out), ReasoningDelta{"hm"}, ContentDelta{out});
}

TEST(OutputParser, PlainContentStreamsWithoutWaitingForMarkers) {
  OutputParser p(opts(kQwen3, false));
  EXPECT_EVENTS(p.push("Hello"), ContentDelta{"Hello"});
  EXPECT_EVENTS(p.push(" <tool_call> x"), ContentDelta{" <tool_call> x"});
  OutputParser q(opts(kHermesOnly));
  EXPECT_EVENTS(q.push("a <"), ContentDelta{"a"});  // " <" may start <tool_call>
  EXPECT_EVENTS(q.push("b"), ContentDelta{" <b"});
}

// ---- Llama 3.x JSON tool calls ----------------------------------------------------

TEST(OutputParser, Llama31JsonCall) {
  EXPECT_EVENTS(parse(opts(kLlama3), "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}"),
                ToolCall{"get_weather", R"({"city":"San Francisco, CA"})"});
}

TEST(OutputParser, Llama31PythonTagCall) {
  EXPECT_EVENTS(
      parse(opts(kLlama3), "<|python_tag|>{\"name\": \"brave_search\", \"parameters\": {\"query\": \"weather\"}}"),
      ToolCall{"brave_search", R"({"query":"weather"})"});
}

TEST(OutputParser, Llama32SeveralCallsSeparatedBySemicolonsOrNewlines) {
  std::string out =
      "\n{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": \"}\"}}\n"
      "{\"type\": \"function\", \"name\": \"c\", \"parameters\": {}}\n";
  EXPECT_EVENTS(parse(opts(kLlama3), out), ToolCall{"a", R"({"x":1})"}, ToolCall{"b", R"({"y":"}"})"},
                ToolCall{"c", "{}"});
}

TEST(OutputParser, LlamaCallWaitsForTheEndOfOutput) {
  OutputParser p(opts(kLlama3));
  EXPECT_EVENTS(p.push("  {\"name\": \"f\", "));
  EXPECT_EVENTS(p.push("\"parameters\": {}}"));
  EXPECT_EVENTS(p.finish(), ToolCall{"f", "{}"});
}

TEST(OutputParser, LlamaPlainAnswerStreams) {
  OutputParser p(opts(kLlama3));
  EXPECT_EVENTS(p.push("The weather"), ContentDelta{"The weather"});
  EXPECT_EVENTS(p.push(" is {sunny}."), ContentDelta{" is {sunny}."});
  EXPECT_EVENTS(p.finish());
}

TEST(OutputParser, LlamaJsonThatIsNotACallIsContent) {
  std::string answer = "{\"answer\": 42}";
  EXPECT_EVENTS(parse(opts(kLlama3), answer), ContentDelta{answer});
  std::string trailing = "{\"name\": \"f\", \"parameters\": {}} and some words";
  EXPECT_EVENTS(parse(opts(kLlama3), trailing), ContentDelta{trailing});
  std::string cut = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": ";
  EXPECT_EVENTS(parse(opts(kLlama3), cut), ContentDelta{cut});
}

TEST(OutputParser, LlamaPythonTagAfterContent) {
  EXPECT_EVENTS(parse(opts(kLlama3), "Searching now.\n<|python_tag|>{\"name\": \"s\", \"parameters\": {\"q\": \"x\"}}"),
                ContentDelta{"Searching now."}, ToolCall{"s", R"({"q":"x"})"});
}

// ---- format detection ----------------------------------------------------------------

TEST(OutputParser, DetectFormatFromTemplateSource) {
  // Fragments written in the style of the real templates.
  std::string qwen3 =
      "{%- if tools %}For each function call, return a json object within <tool_call></tool_call> XML tags"
      "{%- endif %}{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";
  EXPECT_EQ(detect_output_format(qwen3), (OutputFormat{ToolCallFormat::kHermes, true}));
  std::string llama31 =
      "{%- if message.role == \"ipython\" %}...{{- 'Respond in the format {\"name\": function name, "
      "\"parameters\": dictionary of argument name and its value}.' }}{{- '<|python_tag|>' }}";
  EXPECT_EQ(detect_output_format(llama31), (OutputFormat{ToolCallFormat::kLlama3Json, false}));
  std::string llama32 = "{%- if message.role == 'ipython' %} {\"name\": function name, \"parameters\": dict}";
  EXPECT_EQ(detect_output_format(llama32).tool_calls, ToolCallFormat::kLlama3Json);
  std::string r1 = "{{'<｜Assistant｜>'}}{% if add_generation_prompt %}{{'<think>\\n'}}{% endif %}";
  EXPECT_EQ(detect_output_format(r1), (OutputFormat{ToolCallFormat::kNone, true}));
  std::string r1_first = "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}";
  EXPECT_TRUE(detect_output_format(r1_first).reasoning);
  EXPECT_EQ(detect_output_format("{% for m in messages %}{{ m.content }}{% endfor %}"), OutputFormat{});
}

TEST(OutputParser, DetectFormatFromALoadedTemplate) {
  std::string source =
      "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
      "{%- if tools %}<tools>{{ tools | tojson }}</tools> answer with <tool_call>{...}</tool_call>{%- endif %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}";
  ChatTemplate tmpl = ChatTemplate::from_source(source);
  EXPECT_EQ(tmpl.source(true), source);
  EXPECT_EQ(detect_output_format(tmpl.source(true)), (OutputFormat{ToolCallFormat::kHermes, true}));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_TRUE(prompt_opens_reasoning(tmpl.render(messages, nullptr, true)));
  EXPECT_FALSE(prompt_opens_reasoning(tmpl.render(messages, nullptr, false)));
}

// ---- the streaming property --------------------------------------------------------------

struct Case {
  OutputParserOptions options;
  std::string text;
};

std::vector<Case> corpus() {
  return {
      {opts(kQwen3), "<think>\nThe user wants 2+2.\n</think>\n\nThe answer is 4."},
      {opts(kQwen3),
       "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"</tool_call>}\"}}\n</tool_call>"},
      {opts(kQwen3), "  Plain answer with <tags> and </think> and <tool and \n\n spaces  \n"},
      {opts(kReasoningOnly, false, true), "Hmm.\n\nOK </thin </think>\n\n**42** <think>x"},
      {opts(kHermesOnly), "Text\n<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>\n  tail <tool_c"},
      {opts(kHermesOnly), "Grüße 👋\n<tool_call>\n{\"name\": \"wetter\", \"arguments\": {\"stadt\": \"Zürich\"}}"},
      {opts(kLlama3),
       " <|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": \"}\"}}; {\"name\": \"b\", \"parameters\": {}}"},
      {opts(kLlama3), "The answer is {not a call}."},
      {opts(kLlama3), "{\"answer\": 42}"},
      {opts(kLlama3), "Sure.\n<|python_tag|>{\"name\": \"s\", \"parameters\": {}}"},
      {opts(kQwen3, false), "<think>a</think><tool_call>{\"name\": \"f\"}</tool_call>"},
  };
}

TEST(OutputParserStreaming, EverySplitPointGivesTheSameEvents) {
  for (const auto& c : corpus()) {
    auto whole = parse(c.options, c.text);
    for (size_t at = 0; at <= c.text.size(); ++at)
      ASSERT_EQ(parse_pieces(c.options, {c.text.substr(0, at), c.text.substr(at)}), whole)
          << c.text << " split at " << at;
  }
}

TEST(OutputParserStreaming, RandomMultiSplitsAndSingleBytesGiveTheSameEvents) {
  std::mt19937 rng(7);
  for (const auto& c : corpus()) {
    auto whole = parse(c.options, c.text);
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    ASSERT_EQ(parse_pieces(c.options, bytes), whole) << c.text;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string> pieces;
      size_t at = 0;
      while (at < c.text.size()) {
        size_t len = std::uniform_int_distribution<size_t>(0, 6)(rng);
        pieces.push_back(c.text.substr(at, len));
        at += len;
      }
      ASSERT_EQ(parse_pieces(c.options, pieces), whole) << c.text << " trial " << trial;
    }
  }
}

std::string without(std::string s, std::string_view what) {
  for (size_t p; (p = s.find(what)) != std::string::npos;) s.erase(p, what.size());
  return s;
}

// Characters other than markers, whitespace and call separators: what must survive parsing.
std::string substance(std::string s) {
  for (std::string_view m : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<|python_tag|>"}) s = without(s, m);
  std::string out;
  for (char ch : s)
    if (ch != ' ' && ch != '\n' && ch != ';') out += ch;  // ';' separates Llama calls
  return out;
}

// Random outputs from markers and fragments: same events for every split, no
// exception, and every character but markers and whitespace reaches an event.
TEST(OutputParserStreaming, RandomOutputsKeepEveryCharacter) {
  const std::vector<std::string> parts = {
      "<think>", "</think>", "<tool_call>", "</tool_call>",     "<|python_tag|>", "{", "}", "\"", "\\", "a b", "\n",
      " ",       "ü",        ";",           "{\"name\": \"f\"}"};
  std::mt19937 rng(11);
  const OutputParserOptions options[] = {opts(kQwen3), opts(kLlama3), opts(kQwen3, false),
                                         opts(kReasoningOnly, false, true), opts(kHermesOnly)};
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    int n = std::uniform_int_distribution<int>(1, 14)(rng);
    for (int i = 0; i < n; ++i) text += parts[std::uniform_int_distribution<size_t>(0, parts.size() - 1)(rng)];
    for (const auto& o : options) {
      auto whole = parse(o, text);
      std::string seen;
      for (const auto& e : whole) {
        if (auto* r = std::get_if<ReasoningDelta>(&e)) seen += r->text;
        if (auto* ct = std::get_if<ContentDelta>(&e)) seen += ct->text;
        if (std::get_if<ToolCall>(&e)) seen += "{\"name\":\"f\"}";  // the only call the parts can form
      }
      ASSERT_EQ(substance(seen), substance(text)) << text;
      size_t at = std::uniform_int_distribution<size_t>(0, text.size())(rng);
      ASSERT_EQ(parse_pieces(o, {text.substr(0, at), text.substr(at)}), whole) << text << " at " << at;
    }
  }
}

}  // namespace
}  // namespace kettle
