// Loading chat templates from a model folder (tokenizer_config.json or
// chat_template.jinja), choosing among named templates, and rendering with
// the variables transformers' apply_chat_template passes.
#include "chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/parser.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCategory::kNotFound, "cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: a string or an AddedToken dict.
bool token_content(const nlohmann::ordered_json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

// What transformers' special_tokens_map holds: the seven named tokens that are
// set, and additional_special_tokens.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config) {
  static const char* kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                 "pad_token", "cls_token", "mask_token"};
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  std::string s;
  for (const char* name : kNames)
    if (config.contains(name) && token_content(config[name], &s)) out[name] = s;
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : config["additional_special_tokens"])
      if (token_content(t, &s)) list.push_back(s);
    out["additional_special_tokens"] = list;
  }
  return out;
}

}  // namespace

ChatTemplate::Compiled ChatTemplate::compile(std::string name, std::string origin, const std::string& source) {
  try {
    auto body = std::make_shared<jinja::Body>(jinja::parse_template(source));
    return Compiled{std::move(name), std::move(origin), source, std::move(body)};
  } catch (const Error& e) {
    throw Error(e.category(), origin + ": " + e.what());
  }
}

ChatTemplate ChatTemplate::from_source(std::string source, nlohmann::ordered_json special_tokens) {
  ChatTemplate t;
  t.templates_.push_back(compile("", "chat template", source));
  if (!special_tokens.is_null()) t.special_tokens_ = std::move(special_tokens);
  return t;
}

ChatTemplate ChatTemplate::from_path(const std::string& path, const std::string& name) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail(ErrorCategory::kNotFound, "{} does not exist (expected a model folder or tokenizer_config.json)", path);
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path config_path = is_dir ? fs::path(path) / "tokenizer_config.json" : fs::path(path);
  const fs::path dir = is_dir ? fs::path(path) : config_path.parent_path();
  const std::string config_name = config_path.string();

  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_path, ec)) {
    try {
      config = nlohmann::ordered_json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCategory::kInvalidData, "{}: not valid JSON: {}", config_name, e.what());
    }
    if (!config.is_object()) fail(ErrorCategory::kInvalidData, "{}: expected a JSON object", config_name);
  }

  ChatTemplate t;
  t.special_tokens_ = special_tokens_of(config);
  t.requested_name_ = name;
  const auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    t.templates_.push_back(compile("", config_name, it->get<std::string>()));
  } else if (it != config.end() && it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string())
        fail(ErrorCategory::kInvalidData, "{}: chat_template list entries must be {{\"name\": ..., \"template\": ...}}",
             config_name);
      const std::string n = entry["name"].get<std::string>();
      t.templates_.push_back(compile(n, config_name + " (template '" + n + "')", entry["template"].get<std::string>()));
    }
  } else if (it != config.end() && !it->is_null()) {
    fail(ErrorCategory::kInvalidData, "{}: chat_template must be a string or a list of named templates", config_name);
  } else {
    const fs::path jinja = dir / "chat_template.jinja";
    if (!fs::exists(jinja, ec))
      fail(ErrorCategory::kNotFound, "{} has no chat_template and {} does not exist", config_name, jinja.string());
    t.templates_.push_back(compile("", jinja.string(), read_file(jinja)));
  }
  if (!name.empty()) {
    bool found = false;
    for (const auto& c : t.templates_) found = found || c.name == name || (c.name.empty() && name == "default");
    if (!found) {
      std::string names;
      for (const auto& c : t.templates_) names += (names.empty() ? "" : ", ") + (c.name.empty() ? "(unnamed)" : c.name);
      fail(ErrorCategory::kInvalidArgument, "{}: no chat template named '{}' (it has: {})", config_name, name, names);
    }
  }
  return t;
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const auto& c : templates_) out.push_back(c.name);
  return out;
}

const ChatTemplate::Compiled& ChatTemplate::select(bool has_tools) const {
  if (templates_.size() == 1 && templates_[0].name.empty()) return templates_[0];
  auto find = [&](const std::string& n) -> const Compiled* {
    for (const auto& c : templates_)
      if (c.name == n) return &c;
    return nullptr;
  };
  if (!requested_name_.empty()) return *find(requested_name_);
  if (has_tools)
    if (const Compiled* c = find("tool_use")) return *c;
  if (const Compiled* c = find("default")) return *c;
  fail(ErrorCategory::kInvalidArgument, "{}: several chat templates and none named 'default'; pass a template name",
       templates_.front().origin);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  using jinja::Value;
  const Compiled& tmpl = select(!tools.is_null());
  if (!extra.is_null() && !extra.is_object())
    fail(ErrorCategory::kInvalidArgument, "chat template variables must be a JSON object");

  auto globals = std::make_shared<jinja::Scope>();
  jinja::install_globals(*globals);
  auto vars = std::make_shared<jinja::Scope>(globals);
  for (const auto& [k, v] : special_tokens_.items()) vars->set(k, jinja::from_json(v));
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) vars->set(k, jinja::from_json(v));
  // As transformers' render_jinja_template: tools and documents are always passed, None
  // when absent, so `tools is not none` is false rather than true-on-undefined.
  vars->set("messages", jinja::from_json(messages));
  vars->set("tools", jinja::from_json(tools));
  if (!extra.is_object() || !extra.contains("documents")) vars->set("documents", jinja::from_json(nullptr));
  vars->set("add_generation_prompt", Value(add_generation_prompt));

  try {
    jinja::Interpreter interp;
    return interp.render(*tmpl.body, vars);
  } catch (const jinja::LocatedFault& f) {
    if (f.line > 0)
      fail(ErrorCategory::kInvalidArgument, "{}: render error at line {}: {}", tmpl.origin, f.line, f.message);
    fail(ErrorCategory::kInvalidArgument, "{}: render error: {}", tmpl.origin, f.message);
  } catch (const jinja::RenderFault& f) {
    fail(ErrorCategory::kInvalidArgument, "{}: render error: {}", tmpl.origin, f.message);
  }
}

}  // namespace kettle
