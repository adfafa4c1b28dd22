// ChatTemplate: a model's Jinja chat template, loaded from tokenizer_config.json
// (or chat_template.jinja) and rendered the way transformers'
// apply_chat_template does, byte-identical to @huggingface/jinja.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kettle {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  // From a model folder or a tokenizer_config.json path: its chat_template (a
  // string, or a list of {name, template}: `name` if given, else "tool_use"
  // when tools are rendered and it exists, else "default"), else
  // chat_template.jinja in the folder. Special tokens (bos/eos/unk/sep/pad/
  // cls/mask, additional_special_tokens) come from tokenizer_config.json as
  // strings or AddedToken dicts. Errors name the file.
  static ChatTemplate from_path(const std::string& path, const std::string& name = "");
  // special_tokens: {"bos_token": "<s>", ...}, passed to the template as variables.
  static ChatTemplate from_source(std::string source,
                                  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // messages: OpenAI-style array; tools: array, or null for none (then `tools`
  // is undefined in the template); extra: more variables (enable_thinking,
  // documents, date_string, ...) as transformers passes **kwargs.
  // ordered_json keeps the caller's key order, which `tojson` reproduces: parse
  // requests with nlohmann::ordered_json, not nlohmann::json (sorted keys).
  // Throws kettle::Error: kInvalidArgument for render errors (naming the line)
  // and for the template's raise_exception (its message verbatim).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // Names of the templates held ("" for a single unnamed one).
  std::vector<std::string> names() const;
  // The Jinja source render() uses for a request with or without tools (for
  // detect_output_format in chat/output_parser.h).
  const std::string& source(bool has_tools) const { return select(has_tools).source; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  struct Compiled {
    std::string name;
    std::string origin;  // for error messages: the file (and template name)
    std::string source;
    std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body;
  };
  static Compiled compile(std::string name, std::string origin, const std::string& source);
  const Compiled& select(bool has_tools) const;

  std::vector<Compiled> templates_;
  std::string requested_name_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace kettle
