// kettle: entry point. Dispatches to one command per file; turns every
// kettle::Error into a one-line message and a non-zero exit code. The bare
// command, or the bare command with serve's options only, serves (the
// appliance rule): `kettle --port 9000` is `kettle serve --port 9000`.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "build_info.h"  // generated at configure time (cmake/build_info.h.in)
#include "cli/commands.h"
#include "cli/options.h"
#include "util/error.h"

namespace {

bool is_one_of(const char* arg, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (std::strcmp(arg, name) == 0) return true;
  return false;
}

// The arguments with "serve" inserted where the user gave serve's options (or a
// model folder) without naming a command; `help [command]` becomes `[command] --help`.
std::vector<std::string> with_default_command(int argc, char** argv, const CLI::App& app) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return args;
  const char* first = argv[1];
  if (std::strcmp(first, "help") == 0) {
    std::vector<std::string> out(args.begin() + 1, args.end());
    out.emplace_back("--help");
    return out;
  }
  if (is_one_of(first, {"-h", "--help", "--version", "-V"})) return args;
  bool is_command = false;
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == first) is_command = true;
  std::error_code ec;
  if (!is_command && (first[0] == '-' || std::filesystem::is_directory(first, ec))) args.insert(args.begin(), "serve");
  return args;
}

std::string version_line() {
  return fmt::format("kettle {} (commit {}, CUDA {})", KETTLE_VERSION, KETTLE_COMMIT,
                     KETTLE_BUILT_WITH_CUDA ? "on" : "off");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kettle: a local LLM inference appliance\n"
               "  kettle [serve options]   serve (the default command)\n"
               "  kettle help [command]    a command's flags and their defaults"};
  app.name("kettle");
  app.require_subcommand(0, 1);  // none: serve with the defaults
  app.set_version_flag("--version,-V", version_line());
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
  add("embed", "embeddings of texts with an embedding model (JSON Lines)", kettle::cli::register_embed);
  add("serve", "OpenAI-compatible HTTP server (the default command)", kettle::cli::register_serve);
  add("convert", "quantize a checkpoint into MLX's affine layout (-q)", kettle::cli::register_convert);
  add("get", "download a model from the Hugging Face Hub into the local cache (HF_ENDPOINT, HF_TOKEN)",
      kettle::cli::register_get);
  add("ls", "the local models (Hugging Face cache, --models-dir): size, quantization, context, fits", kettle::cli::register_ls);
  add("gc", "superseded snapshots and unreferenced blobs in the Hugging Face cache (dry run unless --yes)",
      kettle::cli::register_gc);
  add("evals", "the recorded bench runs (the eval history), newest first", kettle::cli::register_evals);
  add("fit", "will a model fit? weights, KV cache and working memory per device, longest context", kettle::cli::register_fit);
  CLI::App* serve = app.get_subcommand("serve");

  std::vector<std::string> args = with_default_command(argc, argv, app);
  kettle::cli::set_command_line(args);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    app.parse(args);
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
