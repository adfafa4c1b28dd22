// kettle_mask_bench: the host side of constrained decoding alone — B sequences under
// one JSON schema over a real tokenizer's vocabulary, each step filling every row's
// token mask on the engine's mask threads and drawing a uniformly random allowed
// token per row (what a random-weight model at temperature 1 does under a mask: the
// worst case for the mask cache). Prints the wall time per step's masks, which the
// device step must hide (compare with the decode step time of the same batch).
//   kettle_mask_bench --tokenizer tokenizer.json --json-schema schema.json [--rows 32] [--steps 128]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "grammar/json_schema_gbnf.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace kettle {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<grammar::Constraint> compile(const std::string& schema_path, const std::string& tokenizer_path) {
  const Tokenizer tokenizer = Tokenizer::from_file(tokenizer_path);
  std::ifstream in(schema_path);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(in);
  grammar::JsonGrammarWriter writer;
  const std::string value = writer.add(schema, schema_path);
  // As bench --json-schema: values one per line without end, so every row runs all steps.
  const std::string gbnf = fmt::format("root ::= ( {} \"\\n\" )+\n{}", value, writer.rules());
  auto vocabulary = std::make_shared<grammar::TokenVocabulary>(grammar::TokenVocabulary::from_tokenizer(tokenizer, {}));
  return std::make_shared<grammar::Constraint>(grammar::parse_gbnf(gbnf), std::move(vocabulary), schema_path);
}

int32_t random_allowed(const std::vector<uint32_t>& mask, std::mt19937_64& rng) {
  int64_t count = 0;
  for (uint32_t w : mask) count += __builtin_popcount(w);
  if (count == 0) return -1;
  int64_t pick = static_cast<int64_t>(rng() % static_cast<uint64_t>(count));
  for (size_t w = 0; w < mask.size(); ++w) {
    const int n = __builtin_popcount(mask[w]);
    if (pick >= n) {
      pick -= n;
      continue;
    }
    uint32_t bits = mask[w];
    for (; pick > 0; --pick) bits &= bits - 1;
    return static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits)));
  }
  return -1;
}

int run(int argc, char** argv) {
  CLI::App app{"kettle_mask_bench: token masks per step under a JSON schema"};
  std::string tokenizer, schema;
  int rows = 32, steps = 128, threads = 8, passes = 3;
  uint64_t seed = 1;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json")->required();
  app.add_option("--json-schema", schema, "a JSON schema file")->required();
  app.add_option("--rows", rows, "sequences per step");
  app.add_option("--steps", steps, "steps per pass");
  app.add_option("--passes", passes, "passes (the constraint, and its caches, kept across them)");
  app.add_option("--threads", threads, "mask threads (the engine uses min(8, cores))");
  app.add_option("--seed", seed, "random draws' seed");
  CLI11_PARSE(app, argc, argv);

  auto t0 = Clock::now();
  auto constraint = compile(schema, tokenizer);
  const double compile_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const size_t words = static_cast<size_t>((constraint->vocabulary().size() + 31) / 32);
  ThreadPool pool(threads);
  std::mt19937_64 rng(seed);
  fmt::print("vocabulary {} tokens, compile {:.1f} ms, {} rows, {} threads\n", constraint->vocabulary().size(),
             compile_s * 1e3, rows, threads);
  fmt::print("| pass | mean ms/step | p50 | p99 | max |\n|---|---|---|---|---|\n");
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<grammar::ConstraintMatcher> matchers;
    for (int r = 0; r < rows; ++r) matchers.emplace_back(constraint);
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(rows), std::vector<uint32_t>(words));
    std::vector<double> times;
    for (int s = 0; s < steps; ++s) {
      auto start = Clock::now();
      pool.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) matchers[static_cast<size_t>(r)].fill_mask(masks[static_cast<size_t>(r)]);
      });
      times.push_back(std::chrono::duration<double>(Clock::now() - start).count() * 1e3);
      for (int r = 0; r < rows; ++r) {
        const int32_t id = random_allowed(masks[static_cast<size_t>(r)], rng);
        if (id < 0 || !matchers[static_cast<size_t>(r)].accept(id)) {
          fmt::print(stderr, "row {} step {}: no token to take\n", r, s);
          return 1;
        }
      }
    }
    double sum = 0;
    for (double t : times) sum += t;
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    fmt::print("| {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |\n", pass + 1, sum / static_cast<double>(times.size()),
               sorted[sorted.size() / 2], sorted[sorted.size() * 99 / 100], sorted.back());
  }
  return 0;
}

}  // namespace
}  // namespace kettle

int main(int argc, char** argv) {
  try {
    return kettle::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "kettle_mask_bench: {}\n", e.what());
    return 1;
  }
}
