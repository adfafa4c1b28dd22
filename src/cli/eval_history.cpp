#include "cli/eval_history.h"

#include <sqlite3.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "build_info.h"
#include "cli/options.h"
#include "util/error.h"

namespace kettle::cli {
namespace {

constexpr int kSchemaVersion = 1;
constexpr const char* kSchema = R"(
CREATE TABLE IF NOT EXISTS runs (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  recorded_at TEXT NOT NULL,
  kind        TEXT NOT NULL,
  model       TEXT NOT NULL,
  git_commit  TEXT NOT NULL,
  machine     TEXT NOT NULL,
  device      TEXT NOT NULL,
  flags       TEXT NOT NULL,
  results     TEXT NOT NULL
);)";

// A prepared statement, finalized when it goes.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql, const std::string& path) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK)
      fail(ErrorCategory::kInvalidData, "evals: {}: {}", path, sqlite3_errmsg(db));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  void bind(int i, const std::string& text) { sqlite3_bind_text(stmt_, i, text.c_str(), -1, SQLITE_TRANSIENT); }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int step() { return sqlite3_step(stmt_); }
  std::string text(int i) const {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  int64_t integer(int i) const { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

nlohmann::json parse_or_text(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  return j.is_discarded() ? nlohmann::json(text) : j;
}

std::string number(double x) { return x >= 100 ? fmt::format("{:.0f}", x) : fmt::format("{:.1f}", x); }

// The command line without secrets: an --api-key's value is not kept.
nlohmann::json redacted(const std::vector<std::string>& args) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--api-key" && i + 1 < args.size()) {
      out.push_back(args[i]);
      out.push_back("(redacted)");
      ++i;
    } else {
      out.push_back(args[i].rfind("--api-key=", 0) == 0 ? std::string("--api-key=(redacted)") : args[i]);
    }
  }
  return out;
}

}  // namespace

std::string EvalHistory::default_path() {
  if (const char* env = std::getenv("KETTLE_EVALS_DB"); env && *env) return env;
  std::string base;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg)
    base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = std::string(home) + "/.local/share";
  else
    base = ".";
  return base + "/kettle/evals.sqlite";
}

EvalHistory::EvalHistory(const std::string& path) : path_(path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail(ErrorCategory::kInvalidArgument, "evals: cannot open {}: {}", path, why);
  }
  sqlite3_busy_timeout(db_, 5000);  // another kettle recording at the same moment
  try {
    Statement version(db_, "PRAGMA user_version", path_);  // fails on a file that is not a database
    version.step();
    const int64_t found = version.integer(0);
    if (found > kSchemaVersion)
      fail(ErrorCategory::kInvalidData, "evals: {} has schema version {}; this kettle reads {} and older", path, found,
           kSchemaVersion);
    exec(kSchema);
    exec(fmt::format("PRAGMA user_version = {}", kSchemaVersion).c_str());
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

EvalHistory::~EvalHistory() { sqlite3_close(db_); }

void EvalHistory::exec(const char* sql) const {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string why = message ? message : sqlite3_errmsg(db_);
    sqlite3_free(message);
    fail(ErrorCategory::kInvalidData, "evals: {}: {}", path_, why);
  }
}

int64_t EvalHistory::record(EvalRecord run) {
  Statement insert(db_,
                   "INSERT INTO runs (recorded_at, kind, model, git_commit, machine, device, flags, results) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   path_);
  insert.bind(1, utc_now());
  insert.bind(2, run.kind);
  insert.bind(3, run.model);
  insert.bind(4, std::string(KETTLE_COMMIT));
  insert.bind(5, machine_description());
  insert.bind(6, run.device);
  insert.bind(7, run.flags.dump());
  insert.bind(8, run.results.dump());
  if (insert.step() != SQLITE_DONE) fail(ErrorCategory::kInternal, "evals: {}: {}", path_, sqlite3_errmsg(db_));
  return sqlite3_last_insert_rowid(db_);
}

std::vector<EvalRecord> EvalHistory::latest(int64_t limit) const {
  Statement select(db_,
                   "SELECT id, recorded_at, kind, model, git_commit, machine, device, flags, results FROM runs "
                   "ORDER BY id DESC LIMIT ?",
                   path_);
  select.bind(1, limit > 0 ? limit : int64_t{-1});
  std::vector<EvalRecord> out;
  int rc = SQLITE_ROW;
  while ((rc = select.step()) == SQLITE_ROW) {
    EvalRecord r;
    r.id = select.integer(0);
    r.recorded_at = select.text(1);
    r.kind = select.text(2);
    r.model = select.text(3);
    r.commit = select.text(4);
    r.machine = select.text(5);
    r.device = select.text(6);
    r.flags = parse_or_text(select.text(7));
    r.results = parse_or_text(select.text(8));
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) fail(ErrorCategory::kInvalidData, "evals: {}: {}", path_, sqlite3_errmsg(db_));
  return out;
}

int64_t EvalHistory::clear() {
  Statement count(db_, "SELECT COUNT(*) FROM runs", path_);
  count.step();
  const int64_t n = count.integer(0);
  exec("DELETE FROM runs");
  return n;
}

std::string machine_description() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; cpu.empty() && std::getline(info, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) cpu = line.substr(line.find(':') + 2);
  return fmt::format("{} ({}, {} logical cores)", host, cpu.empty() ? "unknown CPU" : cpu,
                     std::thread::hardware_concurrency());
}

std::string summarize_results(const nlohmann::json& r) {
  if (!r.is_object()) return "";
  std::string out;
  const auto add = [&out](const std::string& part) { out += (out.empty() ? "" : " · ") + part; };
  const auto num = [](const nlohmann::json& j, const char* key) { return j.contains(key) ? j[key].get<double>() : 0.0; };
  if (r.contains("prefill_tokens_per_second") && r.contains("decode_tokens_per_second")) {
    const std::string at = r.value("depth", 0) > 0 ? fmt::format(" @ d{}", r.value("depth", 0)) : "";
    add(fmt::format("pp{}{} {} tok/s", r.value("prompt_tokens", 0), at, number(num(r, "prefill_tokens_per_second"))));
    add(fmt::format("tg{}{} {} tok/s", r.value("gen_tokens", 0), at, number(num(r, "decode_tokens_per_second"))));
  }
  for (const auto& row : r.value("batched", nlohmann::json::array()))
    if (!row.contains("constraint"))
      add(fmt::format("B{} {} tok/s", row.value("batch", 0), number(num(row, "decode_tokens_per_second"))));
  for (const auto& row : r.value("speculation", nlohmann::json::array()))
    add(fmt::format("B{} {:.2f}× at {:.0f} % accepted", row.value("batch", 0), num(row, "speedup"),
                    100.0 * num(row, "acceptance")));
  if (r.contains("output_tokens_per_second"))
    add(fmt::format("{} clients {} tok/s, TTFT p50 {} ms p99 {} ms", r.value("clients", 0),
                    number(num(r, "output_tokens_per_second")), number(1000.0 * num(r["ttft_seconds"], "p50")),
                    number(1000.0 * num(r["ttft_seconds"], "p99"))));
  return out;
}

void record_bench_run(const std::string& db_path, const std::string& kind, const std::string& model,
                      const std::string& device, const nlohmann::json& results) {
  const std::string path = db_path.empty() ? EvalHistory::default_path() : db_path;
  try {
    EvalHistory history(path);
    EvalRecord run;
    run.kind = kind;
    run.model = model;
    run.device = device;
    run.flags = redacted(command_line());
    run.results = results;
    const int64_t id = history.record(std::move(run));
    std::fprintf(stderr, "recorded as run %lld in %s (kettle evals)\n", static_cast<long long>(id), path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: this run was not recorded: %s\n", e.what());
  }
}

}  // namespace kettle::cli
