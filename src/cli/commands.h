// One function per command: registers its flags on the app and returns the
// action to run once parsing succeeded.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kettle::cli {

using Action = std::function<int()>;

Action register_generate(CLI::App& app);
Action register_bench(CLI::App& app);
Action register_tokenize(CLI::App& app);  // cmd_tokenize.cpp
Action register_render(CLI::App& app);    // cmd_render.cpp
Action register_perplexity(CLI::App& app);  // cmd_perplexity.cpp
Action register_serve(CLI::App& app);       // cmd_serve.cpp
Action register_fit(CLI::App& app);         // cmd_fit.cpp
Action register_embed(CLI::App& app);       // cmd_embed.cpp
Action register_convert(CLI::App& app);     // cmd_convert.cpp
Action register_evals(CLI::App& app);       // cmd_evals.cpp
Action register_bench_serve(CLI::App& app); // cmd_bench_serve.cpp (bench's `serve` subcommand)
Action register_ls(CLI::App& app);          // cmd_registry.cpp
Action register_get(CLI::App& app);         // cmd_registry.cpp
Action register_gc(CLI::App& app);          // cmd_registry.cpp

}  // namespace kettle::cli
