// `kettle generate`: load a model, run one prompt through the engine (the one
// serve runs), print the text or the tokens (or one JSON object with --json).
// Sampling flags default to generation_config.json.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <random>

#include "backend/backend.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include <fstream>

#include "engine/engine_core.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/timer.h"

namespace kettle::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt_ids;
  std::string prompt;
  std::string chat;
  std::string system;
  std::string tokenizer;
  std::vector<std::string> vars;
  int64_t max_tokens = 128;
  SamplingOptions sampling;
  uint64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;
  std::string dump_logits;
  ThreadOption threads;
  TensorParallelOption tensor_parallel;
  DeviceOption device;
  KvQuantOption kv_quant;
  SpeculationOption speculation;
  CLI::Option* seed_opt = nullptr;
};

SamplingParams sampling_from(const GenerateFlags& f, const GenerationDefaults& defaults) {
  SamplingParams p = f.sampling.resolve(defaults);
  p.seed = f.seed_opt->count() ? f.seed : std::random_device{}();
  return p;
}

// A text prompt needs the model's tokenizer (--tokenizer overrides the model folder).
std::optional<Tokenizer> load_tokenizer(const GenerateFlags& f) {
  if (f.prompt.empty() && f.chat.empty()) return std::nullopt;
  return Tokenizer::from_file(f.tokenizer.empty() ? f.model : f.tokenizer);
}

// --prompt-ids as given; --prompt encoded as transformers' tokenizer(text) does (special tokens
// added); --chat rendered with the model's chat template, then encoded without adding special
// tokens (the template writes them), as apply_chat_template(tokenize=True) does.
std::vector<int32_t> prompt_tokens(const GenerateFlags& f, const std::optional<Tokenizer>& tokenizer) {
  if (!f.prompt_ids.empty()) return parse_id_list(f.prompt_ids, "--prompt-ids");
  if (!f.prompt.empty()) return tokenizer->encode(f.prompt, true);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  messages.push_back({{"role", "user"}, {"content", f.chat}});
  ChatTemplate chat_template = ChatTemplate::from_path(f.tokenizer.empty() ? f.model : f.tokenizer);
  std::string text = chat_template.render(messages, nullptr, true, parse_template_vars(f.vars));
  return tokenizer->encode(text, false);
}

// --dump-logits: every prompt position's f32 logits, from one prefill of the prompt alone.
void dump_prompt_logits(EngineCore& core, const std::vector<int32_t>& prompt, const std::string& path) {
  const int64_t vocab = core.runner().spec().vocab_size, n = static_cast<int64_t>(prompt.size());
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab) fail(ErrorCategory::kInvalidArgument, "prompt token {} is outside the vocabulary [0, {})", id, vocab);
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  KvCache kv(core.pool());
  core.runner().forward(prompt.data(), n, kv, LogitsFor::kAllTokens, logits.data());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) fail(ErrorCategory::kInvalidArgument, "cannot write logits to {}", path);
}

int run_generate(const GenerateFlags& flags) {
  GenerateFlags f = flags;
  if (f.json) log::set_level(log::Level::kQuiet);
  f.model = model_or_default(f.model);
  const int prompt_kinds = !f.prompt_ids.empty() + !f.prompt.empty() + !f.chat.empty();
  if (prompt_kinds != 1)
    fail(ErrorCategory::kInvalidArgument, "generate: give exactly one of --prompt-ids, --prompt or --chat");

  const SpeculationOptions speculation = f.speculation.resolve();  // a bad value fails before the weights load
  Timer load_timer;
  Model model = load_model(f.model);
  std::optional<Tokenizer> tokenizer = load_tokenizer(f);
  std::vector<int32_t> prompt = prompt_tokens(f, tokenizer);
  double load_ms = load_timer.millis();
  log::info("model {} ({}, {} layers) loaded in {:.0f} ms", f.model, model.spec.model_type, model.spec.n_layers, load_ms);

  auto backends = f.tensor_parallel.make_backends(f.device, f.threads.resolve());
  EngineOptions options;
  options.batch = 1;
  options.kv_quant = f.kv_quant.resolve(f.model);
  options.speculation = speculation;
  EngineCore core(model, tokenizer ? &*tokenizer : nullptr, backend_pointers(backends), options);
  GenerationRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = f.max_tokens;
  request.sampling = sampling_from(f, model.generation);
  request.ignore_eos = f.ignore_eos;
  if (!f.dump_logits.empty()) dump_prompt_logits(core, request.prompt, f.dump_logits);

  // Text prompts stream text; id prompts stream ids.
  bool first = true;
  std::string text;
  auto on_output = [&](const GenerationOutput& out) {
    if (tokenizer) {
      text += out.text;
      if (!f.json) std::fputs(out.text.c_str(), stdout);
    } else if (!f.json) {
      for (int32_t token : out.ids) std::printf("%s%d", std::exchange(first, false) ? "" : ",", token);
    }
    std::fflush(stdout);
  };
  const GenerationResult result = generate(core, request, on_output);
  if (!result.end.ok()) fail(result.end.error_category, "{}", result.end.error);
  const double prefill_ms = result.end.prefill_seconds * 1e3, decode_ms = result.end.decode_seconds * 1e3;
  const auto n_prompt = static_cast<int64_t>(request.prompt.size());
  const auto n_new = static_cast<int64_t>(result.tokens.size());
  const double prefill_tps = n_prompt / (prefill_ms / 1e3);
  const double decode_tps = n_new > 1 ? (n_new - 1) / (decode_ms / 1e3) : 0.0;
  if (f.json) {
    nlohmann::json out = {
        {"model", f.model},
        {"token_ids", result.tokens},
        {"prompt_token_ids", request.prompt},
        {"prompt_tokens", n_prompt},
        {"completion_tokens", n_new},
        {"finish_reason", result.end.finish_reason},
        {"seed", request.sampling.seed},
        {"speculation", result.end.speculative ? nlohmann::json{{"drafted", result.end.drafted}, {"accepted", result.end.accepted}}
                                               : nlohmann::json(nullptr)},
        {"text", tokenizer ? nlohmann::json(text) : nlohmann::json(nullptr)},
        {"timings",
         {{"load_ms", load_ms},
          {"prefill_ms", prefill_ms},
          {"decode_ms", decode_ms},
          {"prefill_tokens_per_second", prefill_tps},
          {"decode_tokens_per_second", decode_tps}}}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);  // the answer's last line before the timing line on stderr
    log::info("prompt {} tokens in {:.1f} ms ({:.1f} tok/s); generated {} tokens in {:.1f} ms ({:.1f} tok/s), {}",
              n_prompt, prefill_ms, prefill_tps, n_new, decode_ms, decode_tps, result.end.finish_reason);
    if (result.end.speculative)
      log::info("speculation: {} of {} drafted tokens accepted", result.end.accepted, result.end.drafted);
  }
  return 0;
}

}  // namespace

Action register_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  app.add_option("-m,--model", f->model, "Hugging Face model folder (default: the bundled demo model)");
  app.add_option("--prompt-ids", f->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  app.add_option("-p,--prompt", f->prompt, "prompt as raw text, encoded with the model's tokenizer.json");
  app.add_option("--chat", f->chat, "a user message, wrapped in the model's chat template");
  app.add_option("--system", f->system, "a system message before --chat");
  app.add_option("--tokenizer", f->tokenizer, "tokenizer.json / tokenizer_config.json folder (default: the model folder)");
  app.add_option("--var", f->vars, "chat-template variable k=v (JSON value or string), e.g. enable_thinking=false");
  app.add_option("-n,--max-tokens", f->max_tokens, "most tokens to generate")->check(CLI::PositiveNumber)->capture_default_str();
  f->sampling.add_to(app);
  f->seed_opt = app.add_option("--seed", f->seed, "random seed; the same seed reproduces a sampled run (default: random)");
  app.add_flag("--json", f->json, "print one JSON object (token_ids, prompt_tokens, completion_tokens, timings)");
  app.add_flag("--ignore-eos", f->ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_option("--dump-logits", f->dump_logits, "write f32 logits of every prompt position to this file (row-major)");
  f->threads.add_to(app);
  f->tensor_parallel.add_to(app);
  f->device.add_to(app);
  f->kv_quant.add_to(app);
  f->speculation.add_to(app);
  return [f] { return run_generate(*f); };
}

}  // namespace kettle::cli
