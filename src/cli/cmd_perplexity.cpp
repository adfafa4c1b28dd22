// `kettle perplexity`: token-level perplexity of a model over a text file, by
// the sliding-window method of Hugging Face's guide and mlx_lm.perplexity.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine_core.h"
#include "engine/perplexity.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/timer.h"

namespace kettle::cli {
namespace {

struct PerplexityFlags {
  std::string model;
  std::string file;
  std::string tokenizer;
  int64_t context = 512;
  int64_t stride = 0;
  bool json = false;
  ThreadOption threads;
  DeviceOption device;
  KvQuantOption kv_quant;
  TensorParallelOption tensor_parallel;
};

std::string read_text(const std::string& path) {
  if (!std::filesystem::exists(path)) fail(ErrorCategory::kNotFound, "--file {} does not exist", path);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) fail(ErrorCategory::kInvalidArgument, "--file {}: cannot read", path);
  return ss.str();
}

int run_perplexity(const PerplexityFlags& flags) {
  PerplexityFlags f = flags;
  if (f.json) log::set_level(log::Level::kQuiet);
  f.model = model_or_default(f.model);
  const std::string text = read_text(f.file);
  Timer load_timer;
  Model model = load_model(f.model);
  Tokenizer tokenizer = Tokenizer::from_file(f.tokenizer.empty() ? f.model : f.tokenizer);
  // As the Hugging Face recipe: tokenizer(text), special tokens included.
  const std::vector<int32_t> ids = tokenizer.encode(text, true);
  log::info("model {} loaded in {:.0f} ms; {} tokens in {}", f.model, load_timer.millis(), ids.size(), f.file);

  const int64_t stride = f.stride > 0 ? f.stride : f.context / 2;
  auto backends = f.tensor_parallel.make_backends(f.device, f.threads.resolve());
  EngineOptions options;
  options.batch = 1;
  options.prefill_chunk = f.context;
  options.kv_quant = f.kv_quant.resolve(f.model);
  EngineCore core(model, &tokenizer, backend_pointers(backends), options);
  std::optional<ProgressBar> progress_bar;
  PerplexityResult r = perplexity(core, ids, f.context, stride, [&](int64_t done, int64_t total, double ppl) {
    if (f.json) return;
    if (!progress_bar) progress_bar.emplace("perplexity", total);
    progress_bar->update(done, fmt::format("ppl {:.3f}", ppl));
  });
  if (progress_bar) progress_bar->finish();
  if (f.json) {
    nlohmann::json out = {{"model", f.model},           {"file", f.file},
                          {"tokens", ids.size()},       {"context", f.context},
                          {"stride", stride},           {"perplexity", r.perplexity},
                          {"mean_nll", r.mean_nll},     {"scored_tokens", r.scored_tokens},
                          {"windows", r.windows},       {"seconds", r.seconds},
                          {"kv_quant", options.kv_quant.name()}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %lld tokens (context %lld, stride %lld, %lld windows, %.1f s)\n", r.perplexity,
                static_cast<long long>(r.scored_tokens), static_cast<long long>(f.context),
                static_cast<long long>(stride), static_cast<long long>(r.windows), r.seconds);
  }
  return 0;
}

}  // namespace

Action register_perplexity(CLI::App& app) {
  auto f = std::make_shared<PerplexityFlags>();
  app.add_option("-m,--model", f->model, "Hugging Face model folder (default: the bundled demo model)");
  app.add_option("-f,--file", f->file, "text file to score")->required();
  app.add_option("--tokenizer", f->tokenizer, "tokenizer.json folder (default: the model folder)");
  app.add_option("-c,--context", f->context, "tokens per window")->capture_default_str();
  app.add_option("-s,--stride", f->stride, "tokens between window starts (default: context / 2)");
  app.add_flag("--json", f->json, "print one JSON object");
  f->tensor_parallel.add_to(app);
  f->threads.add_to(app);
  f->device.add_to(app);
  f->kv_quant.add_to(app);
  return [f] { return run_perplexity(*f); };
}

}  // namespace kettle::cli
