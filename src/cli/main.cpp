// kettle: entry point. Dispatches to one command per file; turns every
// kettle::Error into a one-line message and a non-zero exit code.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <map>
#include <new>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kettle: a local LLM inference appliance"};
  app.require_subcommand(0, 1);  // none: serve with the defaults
  std::map<CLI::App*, kettle::cli::Action> actions;
  auto add = [&](const char* name, const char* help, kettle::cli::Action (*reg)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    actions[sub] = reg(*sub);
  };
  add("generate", "one-shot generation from prompt token ids", kettle::cli::register_generate);
  add("bench", "measure prefill and decode speed and peak memory", kettle::cli::register_bench);
  add("tokenize", "encode text (or decode ids) with a model's tokenizer.json", kettle::cli::register_tokenize);
  add("render", "render a conversation with a model's chat template", kettle::cli::register_render);
  add("perplexity", "perplexity of a model over a text file (sliding window)", kettle::cli::register_perplexity);
  add("serve", "OpenAI-compatible HTTP server (the default command)", kettle::cli::register_serve);
  add("fit", "will a model fit? weights, KV cache and working memory per device, longest context", kettle::cli::register_fit);
  CLI::App* serve = app.get_subcommand("serve");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
    return actions[serve]();  // bare `kettle`: serve the default model
  } catch (const kettle::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 6;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 70;
  }
  return 0;
}
