// `kettle bench`: prefill and decode speed of this machine and this stack,
// llama-bench style (pp: one forward over N prompt tokens; tg: N single-token
// forwards from an empty cache, both on the engine's model runner) or
// llama-batched-bench style (--parallel: B generations through the engine's
// step loop, the one serve runs), with achieved weight-streaming GB/s against
// the device's copy bandwidth measured in the same run (GPU backends), and the
// process's peak memory. --json-schema FILE adds, per B, the same batched test with
// every sequence held to that schema (JSON values one per line, on and on), and the
// cost of the token masks as the decode speed lost.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "backend/backend.h"
#include "cli/bench_common.h"
#include "cli/bench_speculation.h"
#include "cli/eval_history.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine_core.h"
#include "engine/memory_policy.h"
#include "grammar/constraint.h"
#include "grammar/json_schema_gbnf.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "model/model_runner.h"
#include "tokenizer/tokenizer.h"
#include "tensor/host_buffer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/timer.h"

namespace kettle::cli {
namespace {

struct BenchFlags {
  std::string model;
  std::string synthetic;
  SyntheticQuantOption synthetic_quant;
  KvQuantOption kv_quant;
  int prompt_tokens = 128;
  int gen_tokens = 32;
  int repetitions = 3;
  int64_t depth = 0;  // --depth: positions already in the KV cache when pp and tg start (llama-bench -d)
  bool json = false;
  std::string evals_db;    // empty: EvalHistory::default_path()
  bool no_record = false;
  std::vector<int> parallel;  // --parallel: llama-batched-bench's -npl (B sequences at once)
  int64_t prefill_chunk = 2048;
  std::string json_schema;  // --json-schema: a constrained run beside each --parallel row
  std::string tokenizer;    // --tokenizer: the vocabulary its masks are over (default: the model's)
  SpeculationOption speculation;  // --draft-kind: decode with and without drafts (bench_speculation.h)
  std::string prompt_file;        // --prompt-file: the speculation test's prompt, as text
  float temperature = 0.0f;       // --temp: the speculation test samples (default greedy)
  ThreadOption threads;
  DeviceOption device;
  TensorParallelOption tensor_parallel;
};

// Runs context[from, to) into kv, `chunk` tokens per forward, untimed.
void prefill(ModelRunner& t, const std::vector<int32_t>& context, size_t from, size_t to, int64_t chunk, KvCache& kv,
             HostBuffer<float>& logits) {
  while (from < to) {
    const auto n = static_cast<int64_t>(std::min<size_t>(static_cast<size_t>(chunk), to - from));
    t.forward(context.data() + from, n, kv, LogitsFor::kLastToken, logits.data());
    from += static_cast<size_t>(n);
  }
}

// A cache at depth: `base` (the context, prefilled once) lends its whole blocks, shared as
// the prefix cache shares them (the test only appends past them); the rest of the
// context is prefilled untimed.
KvCache at_depth(ModelRunner& t, const KvCache& base, const std::vector<int32_t>& context, int64_t chunk,
                 HostBuffer<float>& logits) {
  KvCache kv = t.new_cache();
  const int64_t bs = t.kv_pool().block_size();
  const int64_t aligned = static_cast<int64_t>(context.size()) / bs * bs;
  if (aligned > 0) {
    std::array<std::vector<int32_t>, KvPool::kKinds> blocks;
    for (int kind = 0; kind < KvPool::kKinds; ++kind)
      if (t.kv_pool().has_kind(kind)) {
        const std::vector<int32_t>& table = base.table(kind);
        blocks[static_cast<size_t>(kind)].assign(table.begin(), table.begin() + aligned / bs);
      }
    kv.adopt(blocks, aligned);
  }
  prefill(t, context, static_cast<size_t>(aligned), context.size(), chunk, kv, logits);
  return kv;
}

double prefill_tps(ModelRunner& t, const std::vector<int32_t>& ids, HostBuffer<float>& logits, KvCache kv) {
  Timer timer;
  t.forward(ids.data(), static_cast<int64_t>(ids.size()), kv, LogitsFor::kLastToken, logits.data());
  return static_cast<double>(ids.size()) / timer.seconds();
}

// Greedy decoding with the argmax where the logits are (on a GPU only the id comes back).
double decode_tps(ModelRunner& t, int n, KvCache kv) {
  int32_t token = 1;
  Timer timer;
  for (int i = 0; i < n; ++i) token = t.forward_greedy(&token, 1, kv);
  return n / timer.seconds();
}

// llama-batched-bench's measure through the engine: B generations, each its own prompt
// of `prompt` tokens and `gen` greedy tokens, submitted at once and stepped as serve
// steps them (prompt chunks of --prefill-chunk tokens beside the decodes). Prefill: until
// every sequence has its first token; decode: the tokens after that, over the time after.
struct BatchedResult {
  int batch = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decoded = 0;  // tokens drawn after the last first token
};

BatchedResult batched_run(EngineCore& core, int batch, int prompt, int gen,
                          const std::shared_ptr<grammar::Constraint>& constraint = nullptr) {
  const int64_t vocab = core.runner().spec().vocab_size;
  Timer clock;
  std::vector<std::shared_ptr<TimingSink>> sinks;
  for (int b = 0; b < batch; ++b) {
    GenerationRequest request;
    std::vector<int32_t> ids = bench_tokens(prompt + b, vocab);
    request.prompt.assign(ids.begin() + b, ids.end());
    request.max_tokens = gen;
    request.ignore_eos = true;
    request.constraint = constraint;
    sinks.push_back(std::make_shared<TimingSink>(clock));
    core.submit(std::move(request), sinks.back());
  }
  core.run_until_idle();
  const double end = clock.seconds();
  BatchedResult r{batch};
  for (const auto& sink : sinks) r.prefill_seconds = std::max(r.prefill_seconds, sink->times.front());
  for (const auto& sink : sinks)
    r.decoded += std::count_if(sink->times.begin(), sink->times.end(), [&](double t) { return t > r.prefill_seconds; });
  r.decode_seconds = end - r.prefill_seconds;
  return r;
}

// --json-schema: the schema's JSON values, one per line, without end: a sequence under it
// decodes as long as an unconstrained one, so the two rows compare step for step.
std::shared_ptr<grammar::Constraint> bench_constraint(const BenchFlags& f, const Model& model) {
  if (f.json_schema.empty()) return nullptr;
  const std::string tokenizer_path = !f.tokenizer.empty() ? f.tokenizer : f.model;
  if (tokenizer_path.empty())
    fail(ErrorCategory::kInvalidArgument, "bench: --json-schema with --synthetic needs --tokenizer FILE (its vocabulary)");
  const Tokenizer tokenizer = Tokenizer::from_file(tokenizer_path);
  std::ifstream in(f.json_schema);
  if (!in) fail(ErrorCategory::kNotFound, "bench: --json-schema {}: cannot read it", f.json_schema);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(in, nullptr, false);
  if (schema.is_discarded()) fail(ErrorCategory::kInvalidArgument, "bench: --json-schema {} is not JSON", f.json_schema);
  grammar::JsonGrammarWriter writer;
  const std::string value = writer.add(schema, f.json_schema);
  const std::string gbnf = fmt::format("root ::= ( {} \"\\n\" )+\n{}", value, writer.rules());
  std::vector<int32_t> ends(model.generation.eos_token_ids.begin(), model.generation.eos_token_ids.end());
  auto vocabulary = std::make_shared<grammar::TokenVocabulary>(grammar::TokenVocabulary::from_tokenizer(tokenizer, ends));
  if (vocabulary->size() > model.spec.vocab_size)
    fail(ErrorCategory::kInvalidArgument, "bench: the tokenizer has {} tokens, the model {}", vocabulary->size(),
         model.spec.vocab_size);
  return std::make_shared<grammar::Constraint>(grammar::parse_gbnf(gbnf), std::move(vocabulary), "--json-schema");
}

nlohmann::json run_batched(const BenchFlags& f, EngineCore& core, const Model& model, const std::string& backend) {
  const std::string& source = model.source;
  const std::shared_ptr<grammar::Constraint> constraint = bench_constraint(f, model);
  batched_run(core, f.parallel.front(), std::min(f.prompt_tokens, 16), 4);  // warm-up
  nlohmann::json rows = nlohmann::json::array();
  if (!f.json)
    std::printf("| model | backend | PP | TG | B | prefill tok/s | decode tok/s | total tok/s |\n|---|---|---|---|---|---|---|---|\n");
  for (int batch : f.parallel) {
    batched_run(core, batch, f.prompt_tokens, 4);  // records this bucket's decode step
    std::vector<BatchedResult> runs, held;
    for (int r = 0; r < f.repetitions; ++r) {
      runs.push_back(batched_run(core, batch, f.prompt_tokens, f.gen_tokens));
      if (constraint) held.push_back(batched_run(core, batch, f.prompt_tokens, f.gen_tokens, constraint));
    }
    if (constraint) {
      std::vector<double> plain, masked;
      for (size_t i = 0; i < runs.size(); ++i) {
        plain.push_back(static_cast<double>(runs[i].decoded) / runs[i].decode_seconds);
        masked.push_back(static_cast<double>(held[i].decoded) / held[i].decode_seconds);
      }
      const Stat a = stat_of(plain), b = stat_of(masked);
      const double cost = 100.0 * (1.0 - b.mean / a.mean);
      rows.push_back({{"batch", batch}, {"constraint", f.json_schema}, {"decode_tokens_per_second", b.mean},
                      {"decode_sd", b.sd}, {"unconstrained_decode_tokens_per_second", a.mean},
                      {"mask_cost_percent", cost}});
      if (!f.json)
        std::printf("| %s + json_schema | %s | %d | %d | %d | | %.1f ± %.1f | mask cost %.1f %% of decode |\n",
                    source.c_str(), backend.c_str(), f.prompt_tokens, f.gen_tokens, batch, b.mean, b.sd, cost);
    }
    std::vector<double> pp, tg, all;
    for (const BatchedResult& r : runs) {
      pp.push_back(batch * f.prompt_tokens / r.prefill_seconds);
      tg.push_back(static_cast<double>(r.decoded) / r.decode_seconds);
      all.push_back(batch * (f.prompt_tokens + f.gen_tokens) / (r.prefill_seconds + r.decode_seconds));
    }
    const Stat p = stat_of(pp), g = stat_of(tg), a = stat_of(all);
    rows.push_back({{"batch", batch}, {"prefill_tokens_per_second", p.mean}, {"decode_tokens_per_second", g.mean},
                    {"decode_sd", g.sd}, {"total_tokens_per_second", a.mean}});
    if (!f.json)
      std::printf("| %s | %s | %d | %d | %d | %.1f | %.1f ± %.1f | %.1f |\n", source.c_str(), backend.c_str(), f.prompt_tokens,
                  f.gen_tokens, batch, p.mean, g.mean, g.sd, a.mean);
  }
  const nlohmann::json results = {{"model", source}, {"backend", backend}, {"prompt_tokens", f.prompt_tokens},
                                   {"gen_tokens", f.gen_tokens}, {"batched", rows}};
  if (f.json) std::printf("%s\n", results.dump().c_str());
  return results;
}

// The --draft-kind test: the prompt of --prompt-file (the model's tokenizer, or --tokenizer) or
// -p synthetic ids, -g tokens, each --parallel B (default 1).
SpeculationBench speculation_bench(const BenchFlags& f, const SpeculationOptions& s, const Model& model,
                                   const std::string& backend) {
  SpeculationBench b;
  if (!f.prompt_file.empty()) {
    std::ifstream in(f.prompt_file);
    if (!in) fail(ErrorCategory::kNotFound, "bench: --prompt-file {}: cannot read it", f.prompt_file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string tokenizer_path = !f.tokenizer.empty() ? f.tokenizer : f.model;
    if (tokenizer_path.empty())
      fail(ErrorCategory::kInvalidArgument, "bench: --prompt-file with --synthetic needs --tokenizer FILE");
    b.prompt = Tokenizer::from_file(tokenizer_path).encode(text);
    if (b.prompt.empty()) fail(ErrorCategory::kInvalidArgument, "bench: --prompt-file {} is empty", f.prompt_file);
  } else {
    b.prompt = bench_tokens(f.prompt_tokens, model.spec.vocab_size);
  }
  b.gen_tokens = f.gen_tokens;
  b.temperature = f.temperature;
  b.repetitions = f.repetitions;
  if (!f.parallel.empty()) b.batches = f.parallel;
  b.model = model.source;
  b.backend = backend;
  b.draft = s.kind == DraftKind::kModel ? fmt::format("model {}", std::filesystem::path(s.draft_model).filename().string())
                                        : fmt::format("{} (n {}..{})", draft_kind_name(s.kind), s.ngram_min, s.ngram_max);
  b.json = f.json;
  return b;
}

double peak_rss_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB
}

// Bytes of KV a sequence of `positions` holds (what one decode step at that depth reads).
size_t kv_bytes_at(const KvPool& pool, int64_t positions) {
  size_t bytes = 0;
  const KvLayout& layout = pool.layout();
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const KvLayer& layer = layout.layers[i];
    const int64_t held = layer.kind == KvLayer::Kind::kWindow ? std::min(positions, layer.window) : positions;
    bytes += static_cast<size_t>(held) * layout.token_bytes(i);
  }
  return bytes;
}

int run_bench(const BenchFlags& f) {
  if (f.model.empty() == f.synthetic.empty())
    fail(ErrorCategory::kInvalidArgument, "bench: give a model folder or --synthetic PRESET (one of them)");
  if (f.depth > 0 && !f.parallel.empty())
    fail(ErrorCategory::kInvalidArgument, "bench: --depth applies to the pp/tg tests, not to --parallel");
  const SpeculationOptions speculation = f.speculation.resolve();
  if (speculation.on() && (f.depth > 0 || !f.json_schema.empty()))
    fail(ErrorCategory::kInvalidArgument, "bench: --draft-kind runs its own test; --depth and --json-schema do not apply");
  if (!speculation.on() && (!f.prompt_file.empty() || f.temperature != 0.0f))
    fail(ErrorCategory::kInvalidArgument, "bench: --prompt-file and --temp are the --draft-kind test's");
  if (f.json) log::set_level(log::Level::kQuiet);
  Timer load_timer;
  const SyntheticQuant quant = f.synthetic_quant.resolve(!f.synthetic.empty());
  Model model = f.synthetic.empty() ? load_model(f.model) : make_synthetic_model(f.synthetic, 1, quant);
  log::info("model {} ready in {:.0f} ms ({:.2f} GB of weights)", model.source, load_timer.millis(), model.weight_bytes() / 1e9);
  const int64_t positions = f.depth + std::max<int64_t>(f.prompt_tokens, f.gen_tokens);
  if (model.spec.max_position_embeddings > 0 && positions > model.spec.max_position_embeddings)
    fail(ErrorCategory::kInvalidArgument, "bench: --depth {} plus the test's {} tokens passes the model's {} positions",
         f.depth, positions - f.depth, model.spec.max_position_embeddings);

  const int threads = f.threads.resolve();
  auto backends = f.tensor_parallel.make_backends(f.device, threads);
  Backend* backend = backends[0].get();
  // The engine serve would make: its memory policy, batch room for the largest B.
  MemoryFlags memory;
  memory.kv_quant = f.kv_quant.resolve(f.synthetic.empty() ? f.model : "");
  memory.prefill_chunk = f.prefill_chunk;
  memory.ranks = f.tensor_parallel.ranks;
  const MemoryDecision decision = decide_memory(model.spec, *backend, memory);
  EngineOptions options;
  options.batch = f.parallel.empty() ? 1 : *std::max_element(f.parallel.begin(), f.parallel.end());
  options.prefill_chunk = f.prefill_chunk;
  options.kv_budget_bytes = decision.kv_budget_bytes;
  options.kv_quant = memory.kv_quant;
  options.speculation = speculation;
  Timer upload_timer;
  EngineCore core(model, nullptr, backend_pointers(backends), options);
  ModelRunner& runner = core.runner();
  if (!backend->host_memory()) log::info("weights resident on {} in {:.0f} ms", backend->name(), upload_timer.millis());
  const auto record = [&](const nlohmann::json& results) {
    const std::string device = backend->host_memory() ? fmt::format("{}, {} threads", backend->name(), threads)
                                                      : backend->name();
    if (!f.no_record) record_bench_run(f.evals_db, "bench", model.source, device, results);
    return 0;
  };
  if (speculation.on()) return record(run_speculation_bench(core, speculation_bench(f, speculation, model, backend->name())));
  if (!f.parallel.empty()) return record(run_batched(f, core, model, backend->name()));
  if (!f.json_schema.empty()) fail(ErrorCategory::kInvalidArgument, "bench: --json-schema applies to --parallel");
  HostBuffer<float> logits(static_cast<size_t>(model.spec.vocab_size));
  auto prompt = bench_tokens(f.prompt_tokens, model.spec.vocab_size);
  const std::vector<int32_t> context = bench_tokens(f.depth, model.spec.vocab_size);
  KvCache base = runner.new_cache();
  prefill(runner, context, 0, context.size(), f.prefill_chunk, base, logits);
  const auto deep = [&] { return at_depth(runner, base, context, f.prefill_chunk, logits); };

  // Warm-up: first launches, library handles, and the recorded decode step.
  prefill_tps(runner, bench_tokens(std::min(f.prompt_tokens, 16), model.spec.vocab_size), logits, runner.new_cache());
  prefill_tps(runner, prompt, logits, deep());
  decode_tps(runner, std::min(f.gen_tokens, 4), deep());
  const double copy_gbps = backend->measure_copy_bandwidth() / 1e9;  // 0 on the CPU
  std::vector<double> pp, tg;
  for (int r = 0; r < f.repetitions; ++r) {
    pp.push_back(prefill_tps(runner, prompt, logits, deep()));
    tg.push_back(decode_tps(runner, f.gen_tokens, deep()));
  }
  Stat p = stat_of(pp), g = stat_of(tg);
  // What a decode step reads of the weights (a MoE layer: its chosen experts' share).
  const double gbps = g.mean * static_cast<double>(model.decode_bytes_per_token()) / 1e9;
  // A decode step at depth also reads the cache: its bytes at the test's mean position.
  const size_t kv_at_depth = kv_bytes_at(core.pool(), f.depth);
  const double kv_gbps = g.mean * static_cast<double>(kv_bytes_at(core.pool(), f.depth + f.gen_tokens / 2)) / 1e9;
  const double rss = peak_rss_gib();
  nlohmann::json out = {{"model", model.source},       {"backend", backend->name()},
                          {"threads", threads},          {"weight_bytes", model.weight_bytes()},
                          {"decode_bytes_per_token", model.decode_bytes_per_token()},
                          {"prompt_tokens", f.prompt_tokens}, {"gen_tokens", f.gen_tokens},
                          {"depth", f.depth}, {"kv_bytes_at_depth", kv_at_depth},
                          {"kv_quant", options.kv_quant.name()},
                          {"decode_kv_gb_per_second", kv_gbps},
                          {"prefill_tokens_per_second", p.mean}, {"prefill_sd", p.sd},
                          {"decode_tokens_per_second", g.mean},  {"decode_sd", g.sd},
                          {"decode_weight_gb_per_second", gbps}, {"peak_rss_gib", rss},
                          {"copy_gb_per_second", copy_gbps},
                          {"decode_fraction_of_copy", copy_gbps > 0 ? gbps / copy_gbps : 0.0}};
  if (f.json) {
    std::printf("%s\n", out.dump().c_str());
    return record(out);
  }
  const std::string at = f.depth > 0 ? fmt::format(" @ d{}", f.depth) : "";
  std::printf("| model | backend | threads | test | tok/s | weight GB/s | KV GB/s |\n|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %s | %d | pp%d%s | %.2f ± %.2f | | |\n", model.source.c_str(), backend->name().c_str(), threads,
              f.prompt_tokens, at.c_str(), p.mean, p.sd);
  std::printf("| %s | %s | %d | tg%d%s | %.2f ± %.2f | %.1f | %.1f |\n", model.source.c_str(), backend->name().c_str(),
              threads, f.gen_tokens, at.c_str(), g.mean, g.sd, gbps, kv_gbps);
  if (copy_gbps > 0)
    std::printf("copy ceiling (device-to-device, read + write): %.1f GB/s; decode streams %.1f %% of it\n", copy_gbps,
                100.0 * gbps / copy_gbps);
  std::printf("peak memory (RSS): %.2f GiB\n", rss);
  std::fflush(stdout);
  return record(out);
}

}  // namespace

Action register_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  app.add_option("model", f->model, "Hugging Face model folder");
  app.add_option("--synthetic", f->synthetic,
                 "random weights of a real shape: llama-3.2-1b, llama-3.1-8b, llama-3.1-70b, qwen3-0.6b, qwen2.5-0.5b, gemma-2-2b, qwen3-30b-a3b, mixtral-8x7b, tiny, "
                 "or a config.json path");
  f->synthetic_quant.add_to(app);
  app.add_option("-p,--prompt-tokens", f->prompt_tokens, "prompt length of the prefill test")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("-g,--gen-tokens", f->gen_tokens, "tokens of the decode test")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("-r,--repetitions", f->repetitions, "runs of each test (mean ± sd reported)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("-d,--depth", f->depth,
                 "positions already in the KV cache when the pp and tg tests start (llama-bench -d): decode at depth")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_flag("--json", f->json, "print one JSON object instead of the table");
  app.add_option("--evals-db", f->evals_db, "record the run in this eval history database (default: $KETTLE_EVALS_DB, "
                                            "else $XDG_DATA_HOME/kettle/evals.sqlite; `kettle evals` shows them)");
  app.add_flag("--no-record", f->no_record, "do not record the run in the eval history");
  app.add_option("--parallel", f->parallel,
                 "batched test (llama-batched-bench's -npl): for each B, B sequences prefill -p tokens each, then "
                 "decode -g tokens each together")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--prefill-chunk", f->prefill_chunk,
                 "prompt tokens per engine step in the batched test (as serve's --prefill-chunk)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--json-schema", f->json_schema,
                 "with --parallel: also run each B with every sequence held to this JSON schema, and report the "
                 "masks' cost");
  app.add_option("--tokenizer", f->tokenizer, "the tokenizer.json of --json-schema's masks (default: the model's)");
  f->tensor_parallel.add_to(app);
  f->threads.add_to(app);
  f->device.add_to(app);
  f->kv_quant.add_to(app);
  f->speculation.add_to(app);
  app.add_option("--prompt-file", f->prompt_file,
                 "--draft-kind's test: its prompt as a text file (default: -p synthetic ids)");
  app.add_option("--temp", f->temperature, "--draft-kind's test: sample at this temperature (default 0: greedy)")
      ->check(CLI::Range(0.0f, 10.0f));
  CLI::App* serve = app.add_subcommand("serve", "a load test against a running server: TTFT, latency, aggregate tok/s");
  Action serve_action = register_bench_serve(*serve);
  return [f, serve, serve_action] { return serve->parsed() ? serve_action() : run_bench(*f); };
}

}  // namespace kettle::cli
