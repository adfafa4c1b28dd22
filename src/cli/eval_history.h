// Eval history: every `kettle bench` and `kettle bench serve` run is recorded
// in a SQLite database — when, which model, commit, machine and device, the
// command line and the results (the run's --json object) — and `kettle evals`
// shows them. The schema (docs/evals.md) is versioned by PRAGMA user_version.
// Where: --evals-db PATH, else $KETTLE_EVALS_DB, else
// $XDG_DATA_HOME/kettle/evals.sqlite (~/.local/share when unset).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

struct sqlite3;

namespace kettle::cli {

struct EvalRecord {
  int64_t id = 0;
  std::string recorded_at;  // ISO 8601, UTC
  std::string kind;         // "bench", "bench serve"
  std::string model;
  std::string commit;
  std::string machine;      // host name and CPU
  std::string device;       // what ran it: the backend, or the server's URL
  nlohmann::json flags;     // the command line, an array of strings
  nlohmann::json results;   // the run's --json object
};

class EvalHistory {
 public:
  static std::string default_path();
  // Opens (creating the file and its folder when missing) and checks the schema; throws
  // kettle::Error naming the file when it is not a database this version reads.
  explicit EvalHistory(const std::string& path);
  ~EvalHistory();
  EvalHistory(const EvalHistory&) = delete;
  EvalHistory& operator=(const EvalHistory&) = delete;

  // Adds a run (id, time, commit and machine filled in here); returns its id.
  int64_t record(EvalRecord run);
  // The latest `limit` runs (0: all), newest first.
  std::vector<EvalRecord> latest(int64_t limit) const;
  // Removes every run; returns how many there were.
  int64_t clear();

 private:
  void exec(const char* sql) const;
  std::string path_;
  sqlite3* db_ = nullptr;
};

// This machine in a line: host name, CPU model and logical cores.
std::string machine_description();
// A run's headline numbers in one line, for the table.
std::string summarize_results(const nlohmann::json& results);
// Records a finished bench run; a database that cannot be written is reported on stderr,
// the run's printed results stand.
void record_bench_run(const std::string& db_path, const std::string& kind, const std::string& model,
                      const std::string& device, const nlohmann::json& results);

}  // namespace kettle::cli
