// `kettle embed`: one embedding per text with an embedding model (sentence-
// transformers layout: last-token, mean or CLS pooling, optional Normalize),
// through the engine serve runs. Prints one JSON object per input (JSON Lines).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/embedding.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::cli {
namespace {

struct EmbedFlags {
  std::string model;
  std::vector<std::string> texts;
  std::string file;
  std::string prompt_name;
  int64_t dimensions = 0;
  int batch = 16;
  int64_t prefill_chunk = 2048;
  ThreadOption threads;
  DeviceOption device;
};

// --text values, then --file's lines (- : standard input), in order.
std::vector<std::string> read_inputs(const EmbedFlags& f) {
  std::vector<std::string> inputs = f.texts;
  if (!f.file.empty()) {
    std::ifstream file;
    if (f.file != "-") {
      file.open(f.file);
      if (!file) fail(ErrorCategory::kNotFound, "--file {}: cannot open", f.file);
    }
    std::istream& in = f.file == "-" ? std::cin : file;
    for (std::string line; std::getline(in, line);) inputs.push_back(line);
  }
  if (inputs.empty()) fail(ErrorCategory::kInvalidArgument, "nothing to embed: give --text or --file");
  return inputs;
}

class EmbeddingCollector : public GenerationSink {
 public:
  void on_output(GenerationOutput output) override {
    if (!output.embedding.empty()) embedding = std::move(output.embedding);
  }
  void on_end(const GenerationEnd& e) override { end = e; }
  std::vector<float> embedding;
  GenerationEnd end;
};

int run_embed(const EmbedFlags& flags) {
  EmbedFlags f = flags;
  log::set_level(log::Level::kQuiet);
  f.model = model_or_default(f.model);
  const std::vector<std::string> inputs = read_inputs(f);
  Model model = load_model(f.model);
  const EmbeddingModel embedder = embedding_model(model);
  check_dimensions(embedder, f.dimensions);
  const std::string prompt = embedding_prompt(embedder, f.prompt_name);
  Tokenizer tokenizer = Tokenizer::from_file(f.model);

  auto backends = TensorParallelOption{}.make_backends(f.device, f.threads.resolve());
  EngineOptions options;
  options.batch = f.batch;
  options.prefill_chunk = f.prefill_chunk;
  EngineCore core(model, &tokenizer, backend_pointers(backends), options);
  std::vector<std::shared_ptr<EmbeddingCollector>> sinks;
  for (size_t i = 0; i < inputs.size(); ++i) {
    // As sentence-transformers: the prompt then the text, tokenized with special tokens.
    GenerationRequest request = embedding_request(embedder, tokenizer.encode(prompt + inputs[i], true), i);
    sinks.push_back(std::make_shared<EmbeddingCollector>());
    core.submit(std::move(request), sinks.back());
  }
  core.run_until_idle();
  for (size_t i = 0; i < sinks.size(); ++i) {
    const EmbeddingCollector& s = *sinks[i];
    if (!s.end.ok() || s.embedding.empty())
      fail(s.end.error_category, "input {}: {}", i, s.end.error.empty() ? "no embedding came back" : s.end.error);
    const nlohmann::ordered_json line = {{"index", i},
                                 {"tokens", s.end.prompt_tokens},
                                 {"embedding", truncate_embedding(s.embedding, f.dimensions)}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

}  // namespace

Action register_embed(CLI::App& app) {
  auto f = std::make_shared<EmbedFlags>();
  app.add_option("-m,--model", f->model, "embedding model folder (sentence-transformers layout)");
  app.add_option("--text", f->texts, "a text to embed (repeatable)");
  app.add_option("-f,--file", f->file, "a file of texts, one per line (- : standard input)");
  app.add_option("--prompt-name", f->prompt_name, "the model's prompt put before each text (e.g. query)");
  app.add_option("--dimensions", f->dimensions, "truncate to this many values and renormalize (Matryoshka models)");
  app.add_option("--batch", f->batch, "texts run together")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--prefill-chunk", f->prefill_chunk, "tokens per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  f->threads.add_to(app);
  f->device.add_to(app);
  return [f] { return run_embed(*f); };
}

}  // namespace kettle::cli
