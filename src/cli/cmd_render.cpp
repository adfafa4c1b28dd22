// `kettle render`: render a conversation (OpenAI-style messages JSON) with a
// model's chat template and print the prompt exactly, or {"prompt": ...}.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "util/error.h"

namespace kettle::cli {
namespace {

struct RenderFlags {
  std::string tokenizer;
  std::string messages;
  std::string tools;
  std::string template_name;
  std::vector<std::string> vars;
  bool add_generation_prompt = false;
  bool json = false;
};

nlohmann::ordered_json read_json(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCategory::kNotFound, "{} {}: cannot open the file", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    // ordered_json: key order reaches the template's tojson unchanged.
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{} {}: not valid JSON: {}", flag, path, e.what());
  }
}

int run_render(const RenderFlags& f) {
  const nlohmann::ordered_json messages = read_json(f.messages, "--messages");
  if (!messages.is_array())
    fail(ErrorCategory::kInvalidArgument, "--messages {}: expected a JSON array of messages", f.messages);
  nlohmann::ordered_json tools = nullptr;
  if (!f.tools.empty()) {
    tools = read_json(f.tools, "--tools");
    if (!tools.is_array() && !tools.is_null())
      fail(ErrorCategory::kInvalidArgument, "--tools {}: expected a JSON array of tool definitions", f.tools);
  }
  const nlohmann::ordered_json extra = parse_template_vars(f.vars);

  const ChatTemplate tmpl = ChatTemplate::from_path(f.tokenizer, f.template_name);
  const std::string prompt = tmpl.render(messages, tools, f.add_generation_prompt, extra);
  if (f.json) {
    const nlohmann::ordered_json out = {{"prompt", prompt}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  }
  return 0;
}

}  // namespace

Action register_render(CLI::App& app) {
  auto f = std::make_shared<RenderFlags>();
  app.add_option("--tokenizer", f->tokenizer, "model folder or tokenizer_config.json holding the chat template")
      ->required();
  app.add_option("--messages", f->messages, "JSON file: an array of {role, content, ...} messages")->required();
  app.add_option("--tools", f->tools, "JSON file: an array of tool (function) definitions");
  app.add_flag("--add-generation-prompt", f->add_generation_prompt, "end with the assistant turn's opening");
  app.add_option("--template-name", f->template_name,
                 "which named template to use (e.g. tool_use) when there are several");
  app.add_option("--var", f->vars, "extra template variable NAME=VALUE (VALUE parsed as JSON if it parses); repeatable")
      ->take_all();
  app.add_flag("--json", f->json, "print {\"prompt\": ...} instead of the raw prompt");
  return [f] { return run_render(*f); };
}

}  // namespace kettle::cli
