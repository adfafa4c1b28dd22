// `kettle evals [--limit N] [--json] [--clear]`: the bench runs recorded in the
// eval history (cli/eval_history.h), newest first.
#include <cstdio>

#include "cli/commands.h"
#include "cli/eval_history.h"

namespace kettle::cli {
namespace {

struct EvalsFlags {
  std::string db;
  int64_t limit = 20;
  bool json = false;
  bool clear = false;
};

// At most n characters of s (a long model path keeps its end).
std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "…" + s.substr(s.size() - n + 1); }

int run_evals(const EvalsFlags& f) {
  const std::string path = f.db.empty() ? EvalHistory::default_path() : f.db;
  EvalHistory history(path);
  if (f.clear) {
    const int64_t n = history.clear();
    std::printf("removed %lld run(s) from %s\n", static_cast<long long>(n), path.c_str());
    return 0;
  }
  const std::vector<EvalRecord> runs = history.latest(f.limit);
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const EvalRecord& r : runs)
      out.push_back({{"id", r.id}, {"recorded_at", r.recorded_at}, {"kind", r.kind}, {"model", r.model},
                     {"commit", r.commit}, {"machine", r.machine}, {"device", r.device}, {"flags", r.flags},
                     {"results", r.results}});
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (runs.empty()) {
    std::printf("no runs recorded in %s (kettle bench records each run)\n", path.c_str());
    return 0;
  }
  std::printf("| id | when (UTC) | kind | model | device | commit | results |\n|---|---|---|---|---|---|---|\n");
  for (const EvalRecord& r : runs)
    std::printf("| %lld | %s | %s | %s | %s | %s | %s |\n", static_cast<long long>(r.id), r.recorded_at.c_str(),
                r.kind.c_str(), tail(r.model, 40).c_str(), r.device.c_str(), r.commit.c_str(),
                summarize_results(r.results).c_str());
  return 0;
}

}  // namespace

Action register_evals(CLI::App& app) {
  auto f = std::make_shared<EvalsFlags>();
  app.add_option("--evals-db", f->db, "the eval history database (default: $KETTLE_EVALS_DB, else "
                                      "$XDG_DATA_HOME/kettle/evals.sqlite)");
  app.add_option("--limit", f->limit, "the latest N runs (0: all)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_flag("--json", f->json, "print the runs as a JSON array (results as the runs' --json objects)");
  app.add_flag("--clear", f->clear, "remove every recorded run");
  return [f] { return run_evals(*f); };
}

}  // namespace kettle::cli
