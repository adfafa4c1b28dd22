// The output parser's state machine: content, reasoning, one Hermes call body,
// and the buffered Llama 3 JSON tail. Each step decides as much of buf_ as the
// text so far allows, so any split of the output gives the same events.
#include "chat/output_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

namespace kettle {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t first_non_space(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!is_space(s[i])) return i;
  return std::string_view::npos;
}

// Length of s without its trailing whitespace.
size_t trimmed_end(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return n;
}

bool all_space(std::string_view s) {
  return first_non_space(s) == std::string_view::npos;
}

// Where a tail of `text` starts that is a proper prefix of `marker` (the marker may
// be arriving in pieces); npos when no tail is.
size_t partial_marker_start(std::string_view text, std::string_view marker) {
  size_t from = text.size() >= marker.size() ? text.size() - marker.size() + 1 : 0;
  for (size_t i = from; i < text.size(); ++i)
    if (marker.starts_with(text.substr(i))) return i;
  return std::string_view::npos;
}

// One past the '}' closing the object that opens at text[open] ('{'), skipping
// braces inside JSON strings; npos when the object does not close.
size_t json_object_end(std::string_view text, size_t open) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = open; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

std::string compact(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// {"name": "...", "arguments"|"parameters": {...}} → ToolCall. Arguments given as a
// string holding a JSON object (some fine-tunes do this) are accepted too.
std::optional<ToolCall> tool_call_from(const ordered_json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall call{name->get<std::string>(), "{}"};
  if (args == j.end() || args->is_null()) return call;
  if (args->is_object()) {
    call.arguments = compact(*args);
    return call;
  }
  if (args->is_string()) {
    ordered_json inner = ordered_json::parse(args->get_ref<const std::string&>(), nullptr, false);
    if (inner.is_object()) {
      call.arguments = compact(inner);
      return call;
    }
  }
  return std::nullopt;
}

std::optional<ToolCall> parse_hermes_body(std::string_view body) {
  ordered_json j = ordered_json::parse(body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return tool_call_from(j);
}

// [<|python_tag|>] {call} [; or whitespace {call}]... → calls; nullopt unless all of it parses.
std::optional<std::vector<ToolCall>> parse_llama_calls(std::string_view text) {
  size_t i = first_non_space(text);
  if (i == std::string_view::npos) return std::nullopt;
  if (text.substr(i).starts_with(kPythonTag)) i += kPythonTag.size();
  std::vector<ToolCall> calls;
  while (true) {
    while (i < text.size() && (is_space(text[i]) || text[i] == ';')) ++i;
    if (i == text.size()) break;
    if (text[i] != '{') return std::nullopt;
    size_t end = json_object_end(text, i);
    if (end == std::string_view::npos) return std::nullopt;
    ordered_json j = ordered_json::parse(text.substr(i, end - i), nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    auto call = tool_call_from(j);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    i = end;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// Appends a delta, merged into the previous event when it is of the same kind.
template <typename Delta>
void append_delta(std::vector<OutputEvent>& out, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty())
    if (auto* last = std::get_if<Delta>(&out.back())) {
      last->text += text;
      return;
    }
  out.emplace_back(Delta{std::string(text)});
}

}  // namespace

OutputFormat detect_output_format(std::string_view source) {
  auto has = [&](std::string_view s) { return source.find(s) != std::string_view::npos; };
  OutputFormat f;
  if (has(kCallOpen))
    f.tool_calls = ToolCallFormat::kHermes;
  else if (has(kPythonTag) || (has("ipython") && has("\"parameters\"")))
    f.tool_calls = ToolCallFormat::kLlama3Json;
  f.reasoning = has(kThinkOpen) || has(kThinkClose);
  return f;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  size_t open = prompt.rfind(kThinkOpen);
  return open != std::string_view::npos && prompt.find(kThinkClose, open) == std::string_view::npos;
}

OutputParser::OutputParser(const OutputParserOptions& options) : options_(options) {
  if (options_.format.reasoning && options_.starts_in_reasoning) {
    mode_ = Mode::kReasoning;
    trim_leading_ = true;
  }
}

bool OutputParser::hermes_active() const {
  return options_.tools_requested && options_.format.tool_calls == ToolCallFormat::kHermes;
}
bool OutputParser::llama_active() const {
  return options_.tools_requested && options_.format.tool_calls == ToolCallFormat::kLlama3Json;
}

std::vector<OutputEvent> OutputParser::push(std::string_view piece) {
  std::vector<OutputEvent> out;
  buf_.append(piece);
  while (step(out)) {
  }
  return out;
}

bool OutputParser::step(std::vector<OutputEvent>& out) {
  if (trim_leading_ && (mode_ == Mode::kContent || mode_ == Mode::kReasoning)) {
    size_t i = first_non_space(buf_);
    if (i == std::string::npos) {
      buf_.clear();
      return false;
    }
    buf_.erase(0, i);
    trim_leading_ = false;
  }
  switch (mode_) {
    case Mode::kContent:
      return at_answer_start_ ? step_content_start(out) : step_content(out);
    case Mode::kReasoning:
      return step_reasoning(out);
    case Mode::kHermesCall:
      return step_hermes_call(out);
    case Mode::kLlamaCalls:
      return false;  // decided at finish()
  }
  return false;
}

// Before the first answer character: <think> may open reasoning, and for Llama 3
// a '{' makes the whole answer a candidate tool call. Leading whitespace waits.
bool OutputParser::step_content_start(std::vector<OutputEvent>&) {
  size_t i = first_non_space(buf_);
  if (i == std::string::npos) return false;
  std::string_view rest = std::string_view(buf_).substr(i);
  if (options_.format.reasoning && !reasoning_done_) {
    if (rest.starts_with(kThinkOpen)) {
      buf_.erase(0, i + kThinkOpen.size());
      mode_ = Mode::kReasoning;
      trim_leading_ = true;
      return true;
    }
    if (kThinkOpen.starts_with(rest)) return false;
  }
  at_answer_start_ = false;
  if (llama_active() && rest.front() == '{') mode_ = Mode::kLlamaCalls;  // buf_ kept whole for the fallback
  return true;
}

bool OutputParser::step_content(std::vector<OutputEvent>& out) {
  std::string_view markers[2];
  size_t n_markers = 0;
  if (hermes_active()) markers[n_markers++] = kCallOpen;
  if (llama_active()) markers[n_markers++] = kPythonTag;
  if (n_markers == 0) {
    emit_content(buf_, out);
    buf_.clear();
    return false;
  }
  std::string_view text = buf_;
  size_t hit = std::string::npos;
  std::string_view which;
  for (size_t m = 0; m < n_markers; ++m) {
    size_t p = text.find(markers[m]);
    if (p < hit) {
      hit = p;
      which = markers[m];
    }
  }
  if (hit != std::string::npos) {
    emit_content(text.substr(0, trimmed_end(text.substr(0, hit))), out);  // whitespace before a call is markup
    if (which == kCallOpen) {
      buf_.erase(0, hit + kCallOpen.size());
      mode_ = Mode::kHermesCall;
      scan_ = 0;
      in_string_ = escaped_ = false;
    } else {
      buf_.erase(0, hit);  // the tag stays: the fallback emits the raw text
      mode_ = Mode::kLlamaCalls;
    }
    return true;
  }
  size_t keep = text.size();
  for (size_t m = 0; m < n_markers; ++m) keep = std::min(keep, partial_marker_start(text, markers[m]));
  // Trailing whitespace waits too: it is dropped if a call follows.
  size_t end = trimmed_end(text.substr(0, keep));
  emit_content(text.substr(0, end), out);
  buf_.erase(0, end);
  return false;
}

bool OutputParser::step_reasoning(std::vector<OutputEvent>& out) {
  std::string_view text = buf_;
  size_t close = text.find(kThinkClose);
  if (close != std::string::npos) {
    append_delta<ReasoningDelta>(out, text.substr(0, trimmed_end(text.substr(0, close))));
    buf_.erase(0, close + kThinkClose.size());
    mode_ = Mode::kContent;
    reasoning_done_ = true;
    trim_leading_ = true;
    at_answer_start_ = true;
    return true;
  }
  size_t end = trimmed_end(text.substr(0, std::min(text.size(), partial_marker_start(text, kThinkClose))));
  append_delta<ReasoningDelta>(out, text.substr(0, end));
  buf_.erase(0, end);
  return false;
}

// Reads the call body up to a </tool_call> outside any JSON string.
bool OutputParser::step_hermes_call(std::vector<OutputEvent>& out) {
  while (scan_ < buf_.size()) {
    char c = buf_[scan_];
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      ++scan_;
      continue;
    }
    if (c == '<') {
      std::string_view rest = std::string_view(buf_).substr(scan_);
      if (rest.starts_with(kCallClose)) {
        std::string body = buf_.substr(0, scan_);
        buf_.erase(0, scan_ + kCallClose.size());
        close_hermes_call(body, true, out);
        return true;
      }
      if (kCallClose.starts_with(rest)) return false;
    }
    if (c == '"') in_string_ = true;
    ++scan_;
  }
  return false;
}

void OutputParser::close_hermes_call(std::string_view body, bool closed, std::vector<OutputEvent>& out) {
  mode_ = Mode::kContent;
  if (auto call = parse_hermes_body(body)) {
    out.emplace_back(std::move(*call));
    after_tool_call_ = true;
    return;
  }
  // Not a call after all: the model's text, markers included, goes out as content.
  std::string raw(kCallOpen);
  raw += body;
  if (closed) raw += kCallClose;
  emit_content(raw, out);
}

void OutputParser::emit_content(std::string_view text, std::vector<OutputEvent>& out) {
  if (text.empty()) return;
  after_tool_call_ = false;
  append_delta<ContentDelta>(out, text);
}

std::vector<OutputEvent> OutputParser::finish() {
  std::vector<OutputEvent> out;
  if (trim_leading_ && (mode_ == Mode::kContent || mode_ == Mode::kReasoning))
    buf_.erase(0, std::min(buf_.size(), first_non_space(buf_)));
  switch (mode_) {
    case Mode::kContent:
      if (!(after_tool_call_ && all_space(buf_))) emit_content(buf_, out);  // whitespace after the last call is markup
      break;
    case Mode::kReasoning:
      append_delta<ReasoningDelta>(out, std::string_view(buf_).substr(0, trimmed_end(buf_)));
      break;
    case Mode::kHermesCall:
      close_hermes_call(buf_, false, out);
      break;
    case Mode::kLlamaCalls:
      if (auto calls = parse_llama_calls(buf_))
        for (auto& call : *calls) out.emplace_back(std::move(call));
      else
        emit_content(buf_, out);
      break;
  }
  buf_.clear();
  mode_ = Mode::kContent;
  at_answer_start_ = false;
  trim_leading_ = false;
  return out;
}

}  // namespace kettle
