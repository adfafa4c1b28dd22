#include "cli/bench_speculation.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/bench_common.h"

namespace kettle::cli {
namespace {

// One run: B greedy generations of the prompt; decode is every token after the last first
// token, over the time and the engine steps after it.
struct DecodeRun {
  double seconds = 0;
  int64_t tokens = 0, steps = 0;
  SpeculationLoad before, after;
};

DecodeRun decode_run(EngineCore& core, const SpeculationBench& b, int batch, bool speculate) {
  core.speculate(speculate);
  Timer clock;
  std::vector<std::shared_ptr<TimingSink>> sinks;
  for (int i = 0; i < batch; ++i) {
    GenerationRequest request;
    request.prompt = b.prompt;
    request.max_tokens = b.gen_tokens;
    request.ignore_eos = true;
    request.sampling.temperature = b.temperature;
    request.sampling.seed = static_cast<uint64_t>(i) + 1;
    request.sampling.seeded = true;
    sinks.push_back(std::make_shared<TimingSink>(clock));
    core.submit(std::move(request), sinks.back());
  }
  DecodeRun run;
  double decode_from = -1;
  while (!core.idle()) {
    core.step();
    if (decode_from >= 0) {
      ++run.steps;
    } else if (std::all_of(sinks.begin(), sinks.end(), [](const auto& s) { return !s->times.empty(); })) {
      decode_from = clock.seconds();
      run.before = core.load().speculation;
    }
  }
  run.seconds = clock.seconds() - decode_from;
  run.after = core.load().speculation;
  for (const auto& sink : sinks)
    run.tokens += std::count_if(sink->times.begin(), sink->times.end(), [&](double t) { return t > decode_from; });
  return run;
}

}  // namespace

nlohmann::json run_speculation_bench(EngineCore& core, const SpeculationBench& b) {
  decode_run(core, b, b.batches.front(), true);  // warm-up: first launches, the draft's caches
  nlohmann::json rows = nlohmann::json::array();
  if (!b.json)
    std::printf("| model | backend | draft | B | decode tok/s | with drafts tok/s | speed-up | accepted | tokens per step |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
  for (int batch : b.batches) {
    std::vector<double> plain, drafted;
    int64_t drafts = 0, accepted = 0, tokens = 0, steps = 0;
    for (int r = 0; r < b.repetitions; ++r) {
      const DecodeRun off = decode_run(core, b, batch, false);
      const DecodeRun on = decode_run(core, b, batch, true);
      plain.push_back(static_cast<double>(off.tokens) / off.seconds);
      drafted.push_back(static_cast<double>(on.tokens) / on.seconds);
      drafts += on.after.drafted - on.before.drafted;
      accepted += on.after.accepted - on.before.accepted;
      tokens += on.tokens;
      steps += on.steps;
    }
    const Stat p = stat_of(plain), d = stat_of(drafted);
    const double acceptance = drafts > 0 ? static_cast<double>(accepted) / static_cast<double>(drafts) : 0.0;
    const double per_step = steps > 0 ? static_cast<double>(tokens) / static_cast<double>(steps * batch) : 0.0;
    rows.push_back({{"batch", batch},
                    {"decode_tokens_per_second", p.mean},
                    {"decode_sd", p.sd},
                    {"speculative_decode_tokens_per_second", d.mean},
                    {"speculative_decode_sd", d.sd},
                    {"speedup", d.mean / p.mean},
                    {"drafted", drafts},
                    {"accepted", accepted},
                    {"acceptance", acceptance},
                    {"tokens_per_target_step", per_step}});
    if (!b.json)
      std::printf("| %s | %s | %s | %d | %.1f ± %.1f | %.1f ± %.1f | %.2f× | %.1f %% | %.2f |\n", b.model.c_str(),
                  b.backend.c_str(), b.draft.c_str(), batch, p.mean, p.sd, d.mean, d.sd, d.mean / p.mean,
                  100.0 * acceptance, per_step);
  }
  const nlohmann::json results = {{"model", b.model},
                                   {"backend", b.backend},
                                   {"draft", b.draft},
                                   {"prompt_tokens", b.prompt.size()},
                                   {"gen_tokens", b.gen_tokens},
                                   {"speculation", rows}};
  if (b.json) std::printf("%s\n", results.dump().c_str());
  return results;
}

}  // namespace kettle::cli
