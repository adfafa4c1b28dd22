// OutputParser: the model's streamed output text → reasoning, content and tool
// calls, as events the server turns into OpenAI/Anthropic deltas. Handles
// <think>…</think> reasoning (DeepSeek-R1, Qwen3, QwQ), Hermes/Qwen
// <tool_call>{json}</tool_call> blocks and Llama 3.x JSON tool calls.
//
// Streaming: text is emitted as soon as it cannot be the start of a marker;
// only a possible partial marker (and markup whitespace, below) is held back.
// For any split of the output into pieces the events, with adjacent deltas of
// one kind merged, are the same.
//
// Markup whitespace (dropped, as llama-server's parsers strip it):
//   - after <think> and before </think>: reasoning is the trimmed text between;
//   - after </think>: the answer starts at its first non-whitespace character;
//   - around tool calls: whitespace right before <tool_call> / <|python_tag|>,
//     between calls and after the last call at the end of the output.
// Everything else — content, reasoning, malformed tool calls — reaches an
// event; nothing is dropped but markers and markup whitespace.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kettle {

struct ReasoningDelta {
  std::string text;
  bool operator==(const ReasoningDelta&) const = default;
};
struct ContentDelta {
  std::string text;
  bool operator==(const ContentDelta&) const = default;
};
// One complete tool call. `arguments` is a JSON object serialized compactly
// (keys in the model's order); the server assigns the call id.
struct ToolCall {
  std::string name;
  std::string arguments;
  bool operator==(const ToolCall&) const = default;
};
using OutputEvent = std::variant<ReasoningDelta, ContentDelta, ToolCall>;

enum class ToolCallFormat {
  kNone,        // no tool-call syntax: everything is content
  kHermes,      // <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>, any number, content before
  kLlama3Json,  // the whole answer is {"name": …, "parameters"|"arguments": {…}} (one or several,
                // separated by ';' or whitespace), optionally after <|python_tag|>
};

struct OutputFormat {
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  bool reasoning = false;  // parse <think>…</think>
  bool operator==(const OutputFormat&) const = default;
};

// Which syntax a model writes, guessed from its chat template's source:
//   - kHermes when the template mentions "<tool_call>" (Qwen2.5/3, QwQ, Hermes);
//   - else kLlama3Json when it mentions "<|python_tag|>", or both "ipython" and
//     "\"parameters\"" (Llama 3.1/3.2/3.3 describe the JSON format in the prompt);
//   - reasoning when it mentions "<think>" or "</think>" (Qwen3, QwQ; DeepSeek-R1's
//     first templates only strip "</think>" from history).
OutputFormat detect_output_format(std::string_view chat_template_source);

// True when the rendered prompt ends inside reasoning: its last <think> has no
// </think> after it (DeepSeek-R1 and some Qwen3 templates put "<think>\n" in
// the generation prompt, so the output starts with the thoughts).
bool prompt_opens_reasoning(std::string_view rendered_prompt);

struct OutputParserOptions {
  OutputFormat format;
  // When the request had no tools, tool-call markers are ordinary content.
  bool tools_requested = false;
  // The output starts inside <think> (see prompt_opens_reasoning); needs format.reasoning.
  bool starts_in_reasoning = false;
};

class OutputParser {
 public:
  explicit OutputParser(const OutputParserOptions& options);

  // Feed the next piece of output; returns the events it completes.
  std::vector<OutputEvent> push(std::string_view piece);
  // End of output: flushes held text. An unclosed <tool_call> is parsed if it
  // is complete JSON, else it is content; unclosed reasoning is reasoning.
  std::vector<OutputEvent> finish();

 private:
  enum class Mode { kContent, kReasoning, kHermesCall, kLlamaCalls };

  bool step(std::vector<OutputEvent>& out);  // consume what can be decided; false: wait for more
  bool step_content(std::vector<OutputEvent>& out);
  bool step_content_start(std::vector<OutputEvent>& out);
  bool step_reasoning(std::vector<OutputEvent>& out);
  bool step_hermes_call(std::vector<OutputEvent>& out);
  void emit_content(std::string_view text, std::vector<OutputEvent>& out);
  void close_hermes_call(std::string_view body, bool closed, std::vector<OutputEvent>& out);

  bool hermes_active() const;
  bool llama_active() const;

  OutputParserOptions options_;
  Mode mode_ = Mode::kContent;
  std::string buf_;               // received, not yet decided
  bool at_answer_start_ = true;   // no answer character decided yet (<think> / Llama '{' may come)
  bool trim_leading_ = false;     // drop whitespace at the front of buf_ (after <think>, </think>)
  bool reasoning_done_ = false;   // a </think> was seen: no second reasoning block
  bool after_tool_call_ = false;  // the last thing decided was a tool call (trailing whitespace is markup)
  // Hermes call body scan: how far buf_ was read, and the JSON string state there,
  // so a "</tool_call>" inside a JSON string does not close the call.
  size_t scan_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace kettle
