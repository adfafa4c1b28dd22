// `kettle serve [model]` (also bare `kettle`): load the model, start the engine
// thread and the HTTP server (OpenAI and Anthropic APIs, the chat page);
// SIGINT/SIGTERM stop admission and drain in-flight requests (--drain-timeout, 10 s), then
// write the prefix cache's blocks to the disk tier when there is one (--ssd-cache, bounded by
// --shutdown-timeout, 120 s) and log what was written and what was not, then exit 0. Signals reach a watcher thread through a
// self-pipe (OpenBLAS starts threads before main, so a sigwait mask cannot cover all).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/embedding.h"
#include "engine/engine.h"
#include "engine/memory_policy.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/config.h"
#include "model/memory_plan.h"
#include "model/hf_cache.h"
#include "model/model_fingerprint.h"
#include "model/model_runner.h"
#include "server/engine_proxy.h"
#include "server/engine_pool.h"
#include "server/engine_supervisor.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/subprocess.h"

namespace kettle::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};  // the self-pipe: written only by the signal handler

extern "C" void on_signal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
}

// Routes SIGINT and SIGTERM into the pipe; returns the signal read from it (blocking).
void install_signal_pipe() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) fail(ErrorCategory::kInternal, "serve: cannot create the signal pipe");
  fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int wait_for_signal() {
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return byte;
}

struct ServeFlags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t max_tokens = 0;  // 0: until EOS or the context
  SamplingOptions sampling;  // the defaults of requests that give none
  bool no_open = false;
  std::string thinking = "on";
  int max_queue = 64;
  int max_connections = 4096;
  bool literal_special_tokens = false;
  std::vector<std::string> api_keys;
  std::vector<std::string> cors_origins;
  std::vector<std::string> allowed_hosts;
  double drain_seconds = 10.0;
  double response_store_mb = 64.0;
  int64_t response_ttl = 3600;
  double prompt_cache_gb = 8.0;
  int batch = 8;
  int64_t prefill_chunk = 2048;
  double kv_budget_gb = -1.0;      // unset: the memory policy's share (engine/memory_policy.h)
  double memory_budget_gb = -1.0;  // unset: the device's memory
  bool paged_kv = true;            // always on; the flag is accepted for compatibility
  int kv_block_size = KvPool::kDefaultBlockSize;
  TensorParallelOption tensor_parallel;
  ThreadOption threads;
  DeviceOption device;
  KvQuantOption kv_quant;
  SpeculationOption speculation;
  std::string ssd_cache;            // empty: no disk tier
  double ssd_cache_max_gb = 0.0;    // 0: unlimited
  bool ssd_cache_verify = false;
  double ssd_demote_idle = 300.0;
  double shutdown_seconds = 120.0;
  int64_t generation_checkpoint = 0;
  std::string unix_socket;  // listen here instead of host:port
  bool isolate = false;     // the engine in a child process (run_isolated)
  int model_pool = 0;       // --model-pool N: engines for the models requests name (0: none)
  std::vector<std::string> models_dirs;  // where a pool finds models besides the hub cache
  std::string served_model_name;         // the model's id in answers and /v1/models (default: as given)
  double device_share = 1.0;             // of the device's memory, this server's share
  const CLI::App* app = nullptr;         // serve's parser: which of its options take values
};

// Opens the chat page in the desktop's browser when there is a desktop (xdg-open, detached).
void open_browser(const std::string& url) {
  if (!std::getenv("DISPLAY") && !std::getenv("WAYLAND_DISPLAY")) return;
  pid_t pid = fork();  // child forks the opener and exits at once, so no zombie is left behind
  if (pid > 0) waitpid(pid, nullptr, 0);
  if (pid == 0 && fork() != 0) _exit(0);
  if (pid == 0) {
    setsid();
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);
      dup2(devnull, STDERR_FILENO);
    }
    execlp("xdg-open", "xdg-open", url.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
}

// The flags the memory policy reads (engine/memory_policy.h), as fit reads them.
MemoryFlags memory_flags(const ServeFlags& flags, const KvQuant& kv_quant) {
  MemoryFlags m;
  m.kv_quant = kv_quant;
  if (flags.kv_budget_gb >= 0) m.kv_budget_gb = flags.kv_budget_gb;
  if (flags.memory_budget_gb >= 0) m.memory_budget_gb = flags.memory_budget_gb;
  m.prompt_cache_gb = flags.prompt_cache_gb;
  m.prefill_chunk = flags.prefill_chunk;
  m.ranks = flags.tensor_parallel.ranks;
  m.device_share = flags.device_share;
  return m;
}

// --draft-kind model: the draft's weights are held beside the model's, and the KV budget is
// split between the two pools by their bytes per token (a draft's caches hold the tokens its
// sequences' caches hold).
struct DraftMemory {
  size_t weight_bytes = 0, kv_bytes_per_token = 0;
};
DraftMemory draft_memory(const SpeculationOptions& speculation, const Backend& backend) {
  if (speculation.kind != DraftKind::kModel) return {};
  const ModelSpec draft = load_model_config(speculation.draft_model);  // its config alone: the drafter loads it
  const MemoryPlan plan = plan_memory(draft, 1, weight_storage(draft, backend), kv_layout(draft, backend.kv_dtype()), 1);
  return {plan.weight_bytes, plan.kv_bytes_per_token + plan.window_kv_bytes_per_token};
}

// A model without a chat template still serves /v1/completions.
std::optional<ChatTemplate> load_chat_template(const std::string& folder) {
  try {
    return ChatTemplate::from_path(folder);
  } catch (const Error& e) {
    log::warn("no chat template ({}); /v1/chat/completions is disabled", e.what());
    return std::nullopt;
  }
}

// The durable part of a shutdown: every cached block to the disk tier, within the timeout.
void write_cache_to_disk(Engine& engine, double timeout_seconds) {
  const CacheFlushReport r = engine.flush_cache_to_disk(timeout_seconds);
  log::info("ssd cache at shutdown: {}; {} entries written since start, {} blocks not on disk ({} still queued), "
            "{} dropped, {} errors", r.durable ? "every cached block is on disk" : "NOT every cached block is on disk",
            r.written, r.not_on_disk, r.queued, r.dropped, r.errors);
}

void check_api_keys(const ServeFlags& flags) {
  for (const std::string& key : flags.api_keys)
    if (key.size() < 8) fail(ErrorCategory::kInvalidArgument, "--api-key: a key needs at least 8 characters");
}

// The listener on --unix or --host/--port (either server: HttpServer, or --isolate's EngineProxy), with the
// warning for an address others can reach without a key.
template <typename Listener>
void bind_listener(Listener& listener, const ServeFlags& flags, const server::AccessConfig& access) {
  if (!flags.unix_socket.empty()) return listener.bind_unix(flags.unix_socket);
  listener.bind(flags.host, flags.port);
  if (flags.api_keys.empty() && server::AccessPolicy(access).exposed())
    log::warn("serve: listening on {} without an API key: anyone who can reach this address can use the model "
              "(set --api-key or KETTLE_API_KEY)", flags.host);
}

std::string listen_address(const ServeFlags& flags) {
  return flags.unix_socket.empty() ? fmt::format("http://{}:{}", flags.host, flags.port) : "unix:" + flags.unix_socket;
}

// serve's arguments as given (after "serve") without the options named in `drop` (and their values)
// and, when `drop_model`, without the model positional; serve's parser says which options take values.
std::vector<std::string> forwarded_args(const CLI::App& app, const std::set<std::string>& drop, bool drop_model) {
  std::vector<std::string> given = command_line();
  if (!given.empty() && given.front() == "serve") given.erase(given.begin());
  std::vector<std::string> out;
  bool positionals_only = false;
  for (size_t i = 0; i < given.size(); ++i) {
    const std::string& arg = given[i];
    if (positionals_only || arg.size() < 2 || arg[0] != '-') {  // the model
      if (!drop_model) out.push_back(arg);
      continue;
    }
    if (arg == "--") {
      positionals_only = true;
      if (!drop_model) out.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const CLI::Option* option = app.get_option_no_throw(name);
    size_t values = 0;  // the arguments after it that are its values
    const int takes = option && eq == std::string::npos ? option->get_items_expected_max() : 0;  // flags: 0
    if (takes > 0)
      while (static_cast<int>(values) < takes && i + 1 + values < given.size() &&
             (values == 0 || given[i + 1 + values].rfind("-", 0) != 0))
        ++values;
    const bool keep = !drop.contains(name);
    for (size_t k = 0; k <= values; ++k)
      if (keep) out.push_back(given[i + k]);
    i += values;
  }
  return out;
}

// An engine child's command line: this one for `folder` (or the model given), without the parent's own
// options, listening on `socket`, never opening a browser.
std::vector<std::string> child_command_line(const ServeFlags& flags, const std::string& socket) {
  std::vector<std::string> args = {"kettle", "serve"};
  for (std::string& a : forwarded_args(*flags.app, {"--isolate", "--unix"}, false)) args.push_back(std::move(a));
  if (std::find(args.begin(), args.end(), "--no-open") == args.end()) args.push_back("--no-open");
  args.push_back("--unix");
  args.push_back(socket);
  return args;
}

// A --model-pool engine's command line: `model`'s folder under its id, with its share of the device and
// its own disk-tier folder (a disk tier is one server's).
std::vector<std::string> pool_child_command_line(const ServeFlags& flags, const server::PoolModel& model,
                                                 const std::string& socket) {
  std::vector<std::string> args = {"kettle", "serve", "--", model.folder};
  const std::set<std::string> parents = {"--isolate", "--unix", "--model-pool", "--models-dir", "--device-share",
                                         "--ssd-cache", "--no-open"};
  const std::vector<std::string> options = forwarded_args(*flags.app, parents, true);
  args.insert(args.begin() + 2, options.begin(), options.end());
  const std::vector<std::string> own = {"--no-open", "--unix", socket, "--served-model-name", model.id,
                                        "--device-share", fmt::format("{:.6f}", flags.device_share / flags.model_pool)};
  args.insert(args.begin() + 2, own.begin(), own.end());
  if (!flags.ssd_cache.empty()) {
    std::string slug = model.id;
    for (char& c : slug)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '~';
    const std::vector<std::string> ssd = {"--ssd-cache", (std::filesystem::path(flags.ssd_cache) / slug).string()};
    args.insert(args.begin() + 2, ssd.begin(), ssd.end());
  }
  return args;
}

// --model-pool's GET /v1/models rows: `kettle ls --json` run as a child (the parent never touches the
// GPU), for an engine's share of the device; kept a minute.
std::function<nlohmann::json()> local_model_rows(const ServeFlags& flags, const std::string& default_folder) {
  struct Cache {
    std::mutex mutex;
    nlohmann::json rows;
    std::chrono::steady_clock::time_point at{};
    bool filled = false;
  };
  auto cache = std::make_shared<Cache>();
  std::vector<std::string> argv = {"/proc/self/exe", "ls", "--json", "--device", flags.device.device, "--device-share",
                                   fmt::format("{:.6f}", flags.device_share / flags.model_pool), "--models-dir",
                                   default_folder};
  for (const std::string& dir : flags.models_dirs) {
    argv.push_back("--models-dir");
    argv.push_back(dir);
  }
  return [cache, argv] {
    std::lock_guard lock(cache->mutex);
    if (cache->filled && std::chrono::steady_clock::now() - cache->at < std::chrono::minutes(1)) return cache->rows;
    const CapturedRun run = run_captured(argv, 120, size_t{64} << 20);
    cache->rows = nlohmann::json::array();
    try {
      if (run.ok) cache->rows = nlohmann::json::parse(run.out).at("models");
    } catch (const std::exception& e) {
      log::warn("serve: the local model list (kettle ls --json) is unreadable: {}", e.what());
    }
    if (!run.ok) log::warn("serve: listing the local models (kettle ls --json) failed: {}", run.why);
    cache->filled = true;
    cache->at = std::chrono::steady_clock::now();
    return cache->rows;
  };
}

// The pool's default engine: the command line's model, under its registry id when it is one.
server::PoolModel default_pool_model(const ServeFlags& flags) {
  if (flags.model.empty() || std::filesystem::is_directory(flags.model)) {
    const std::string folder = model_or_default(flags.model);
    return {model_folder_name(folder), folder};
  }
  const CachedModel m = find_model(list_local_models(hf_hub_cache_dir(), flags.models_dirs), flags.model, "the local registry");
  return {m.id, m.folder};
}

// The registry a pool routes by: the hub cache and each --models-dir, a name found as `kettle ls` finds it.
void set_pool_registry(server::PoolConfig& pool, const ServeFlags& flags) {
  pool.list_models = [dirs = flags.models_dirs] {
    std::vector<server::PoolModel> out;
    for (const CachedModel& m : list_local_models(hf_hub_cache_dir(), dirs)) out.push_back({m.id, m.folder});
    return out;
  };
  pool.find_model = [](const std::vector<server::PoolModel>& models, const std::string& name) {
    std::vector<CachedModel> cached;
    for (const server::PoolModel& m : models) cached.push_back({m.id, m.folder, ""});
    const CachedModel& m = find_model(cached, name, "the local registry (`kettle ls`)");
    return server::PoolModel{m.id, m.folder};
  };
}

// serve --isolate: this process binds the port and relays to an engine child it supervises;
// it never loads the model or touches the GPU, so a fault there leaves it serving.
int run_isolated(const ServeFlags& flags) {
  if (std::getenv(server::kEngineChildEnv))  // never a child of a child, whatever the command line says
    fail(ErrorCategory::kInvalidArgument, "serve: --isolate or --model-pool inside an engine child");
  if (flags.model_pool > 0 && !flags.served_model_name.empty())
    fail(ErrorCategory::kInvalidArgument,
         "serve: --served-model-name names one model; with --model-pool each engine is named by its model's id");
  install_signal_pipe();
  std::signal(SIGPIPE, SIG_IGN);
  check_api_keys(flags);
  char dir_template[] = "/tmp/kettle-engine-XXXXXX";  // 0700: only this user reaches the child
  const char* dir = mkdtemp(dir_template);
  if (!dir) fail(ErrorCategory::kInternal, "serve --isolate: cannot make a directory for the engine socket in /tmp");
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_dir{dir};
  server::PoolConfig pool_config;
  pool_config.route_by_model = flags.model_pool > 0;
  pool_config.capacity = std::max(1, flags.model_pool);
  pool_config.default_model = pool_config.route_by_model ? default_pool_model(flags)
                                                         : server::PoolModel{flags.model, flags.model};
  if (pool_config.route_by_model) set_pool_registry(pool_config, flags);
  pool_config.socket_dir = dir;
  pool_config.command = [&flags](const server::PoolModel& model, const std::string& socket) {
    return flags.model_pool > 0 ? pool_child_command_line(flags, model, socket) : child_command_line(flags, socket);
  };
  pool_config.stop_seconds = flags.drain_seconds + (flags.ssd_cache.empty() ? 0.0 : flags.shutdown_seconds) + 10.0;
  server::EnginePool pool(pool_config);
  server::ProxyConfig config;
  config.access = {flags.api_keys, flags.cors_origins, flags.allowed_hosts, flags.host};
  config.http.max_connections = flags.max_connections;
  config.workers = 2 * (flags.batch + flags.max_queue) * pool_config.capacity + 16;  // the children's 429 and 503 come first
  if (pool_config.route_by_model) config.local_model_rows = local_model_rows(flags, pool_config.default_model.folder);
  server::EngineProxy proxy(config, pool);
  bind_listener(proxy, flags, config.access);
  pool.start();
  std::thread signal_thread([&] {
    int signal = wait_for_signal();
    if (signal == 0) return;
    // The child drains its requests (--drain-timeout) and writes its disk tier (--shutdown-timeout).
    const double child_seconds = flags.drain_seconds + (flags.ssd_cache.empty() ? 0.0 : flags.shutdown_seconds) + 10.0;
    log::info("{}: stopping the engine child (it finishes in-flight requests, up to {:.1f} s), then exiting",
              signal == SIGINT ? "SIGINT" : "SIGTERM", flags.drain_seconds);
    proxy.shutdown(child_seconds);
  });
  const std::string base = listen_address(flags);
  const std::string what =
      flags.model_pool > 0
          ? fmt::format("the local models (`kettle ls`), up to {} at once, by each request's model (default {})",
                        flags.model_pool, pool_config.default_model.id)
          : model_or_default(flags.model) + " in an engine child process (--isolate)";
  std::printf("kettle serving %s\n  chat page:     %s/\n  OpenAI API:    %s/v1\n"
              "  Anthropic API: %s/v1/messages\n  engine state:  %s/engine\n",
              what.c_str(), base.c_str(), base.c_str(), base.c_str(), base.c_str());
  std::fflush(stdout);
  if (!flags.no_open && flags.unix_socket.empty()) open_browser(base + "/");
  proxy.listen();
  if (g_signal_pipe[1] >= 0) close(g_signal_pipe[1]);
  signal_thread.join();
  pool.stop(5);
  log::info("server stopped");
  return 0;
}

int run_serve(const ServeFlags& flags) {
  if (flags.isolate || flags.model_pool > 0) return run_isolated(flags);
  install_signal_pipe();
  std::signal(SIGPIPE, SIG_IGN);

  const std::string folder = model_or_default(flags.model);
  const KvQuant kv_quant = flags.kv_quant.resolve(folder);  // a bad value fails before the weights load
  SpeculationOptions speculation = flags.speculation.resolve();
  Model model = load_model(folder);
  Tokenizer tokenizer = Tokenizer::from_file(folder);
  // An embedding model answers /v1/embeddings only: no chat template is read.
  std::optional<ChatTemplate> chat_template = model.embedding ? std::nullopt : load_chat_template(folder);

  server::ServerConfig config;
  // A registry query names the model as the user wrote it (as vLLM does); a folder by its name.
  config.model_id = !flags.served_model_name.empty()                                      ? flags.served_model_name
                    : flags.model.empty() || std::filesystem::is_directory(flags.model) ? model_folder_name(folder)
                                                                                        : flags.model;
  config.context_length = model.spec.max_position_embeddings;
  config.weight_bytes = model.weight_bytes();
  if (const QuantConfig& q = model.spec.quant; q.present())
    config.quantization = {quant_method_name(q.method), q.defaults.bits, q.defaults.group_size,
                           {q.fp8_block[0], q.fp8_block[1]}};
  config.vocab_size = model.spec.vocab_size;
  config.end_ids.assign(model.generation.eos_token_ids.begin(), model.generation.eos_token_ids.end());
  config.thinking = flags.thinking == "on";
  config.max_queue = flags.max_queue;
  config.batch = flags.batch;
  config.default_max_tokens = flags.max_tokens;
  config.response_store_bytes = static_cast<size_t>(flags.response_store_mb * 1e6);
  config.response_ttl_seconds = flags.response_ttl;
  config.http.max_connections = flags.max_connections;
  config.literal_special_tokens = flags.literal_special_tokens;
  config.access = {flags.api_keys, flags.cors_origins, flags.allowed_hosts, flags.host};
  check_api_keys(flags);
  config.sampling = flags.sampling.resolve(model.generation);
  if (model.embedding) config.embedding = embedding_model(model);

  // One backend per tensor-parallel rank; CPU ranks share the cores (and one RAM).
  std::vector<std::unique_ptr<Backend>> backends = flags.tensor_parallel.make_backends(flags.device, flags.threads.resolve());
  // Measured before the weights load, as fit measures it: fit reports this decision.
  const DraftMemory draft = draft_memory(speculation, *backends[0]);
  MemoryFlags memory_wanted = memory_flags(flags, kv_quant);
  memory_wanted.other_weight_bytes = draft.weight_bytes;
  const MemoryDecision memory = decide_memory(model.spec, *backends[0], memory_wanted);
  size_t kv_budget = memory.kv_budget_bytes;
  if (const size_t own = memory.plan.kv_bytes_per_token + memory.plan.window_kv_bytes_per_token;
      draft.kv_bytes_per_token > 0 && kv_budget > 0) {
    speculation.draft_kv_bytes = static_cast<size_t>(static_cast<double>(kv_budget) * static_cast<double>(draft.kv_bytes_per_token) /
                                                     static_cast<double>(own + draft.kv_bytes_per_token));
    kv_budget -= speculation.draft_kv_bytes;
  }
  EngineOptions engine_options;
  engine_options.batch = flags.batch;
  engine_options.prefill_chunk = flags.prefill_chunk;
  engine_options.kv_budget_bytes = kv_budget;
  engine_options.speculation = speculation;
  engine_options.reserve_kv = memory.reserve_kv;
  engine_options.prompt_cache_bytes = std::min(memory.prompt_cache_bytes, kv_budget);
  engine_options.kv_block_size = flags.kv_block_size;
  engine_options.kv_quant = kv_quant;
  engine_options.ssd.dir = flags.ssd_cache;
  engine_options.ssd.max_bytes = static_cast<size_t>(flags.ssd_cache_max_gb * 1e9);
  engine_options.ssd.verify = flags.ssd_cache_verify;
  engine_options.ssd.demote_idle_seconds = flags.ssd_demote_idle;
  engine_options.checkpoint_every = flags.generation_checkpoint;
  config.flush_timeout_seconds = flags.shutdown_seconds;
  Engine engine(model, tokenizer, std::move(backends), engine_options);
  server::HttpServer http(config, tokenizer, chat_template ? &*chat_template : nullptr, engine);
  bind_listener(http, flags, config.access);

  std::thread signal_thread([&] {
    int signal = wait_for_signal();
    if (signal == 0) return;  // the listener failed; nothing to drain
    log::info("{}: finishing in-flight requests (up to {:.1f} s), then exiting", signal == SIGINT ? "SIGINT" : "SIGTERM",
              flags.drain_seconds);
    http.shutdown(flags.drain_seconds);
  });
  const std::string base = listen_address(flags);
  if (model.embedding)
    std::printf("kettle serving %s (%s), an embedding model (%s pooling)\n  embeddings:    %s/v1/embeddings\n",
                config.model_id.c_str(), folder.c_str(), pooling_name(model.embedding->pooling), base.c_str());
  else
    std::printf("kettle serving %s (%s)\n  chat page:     %s/\n  OpenAI API:    %s/v1\n  Anthropic API: %s/v1/messages\n",
                config.model_id.c_str(), folder.c_str(), base.c_str(), base.c_str(), base.c_str());
  std::fflush(stdout);
  if (!flags.no_open && flags.unix_socket.empty()) open_browser(base + "/");
  http.listen();
  if (g_signal_pipe[1] >= 0) close(g_signal_pipe[1]);  // wakes the watcher when listen ended on its own
  signal_thread.join();
  if (!flags.ssd_cache.empty()) write_cache_to_disk(engine, flags.shutdown_seconds);
  engine.stop();
  log::info("server stopped");
  return 0;
}

}  // namespace

Action register_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  f->app = &app;
  app.add_option("model", f->model, "Hugging Face model folder (default: the bundled demo model)");
  app.add_option("--host", f->host, "address to listen on")->capture_default_str();
  app.add_option("--unix", f->unix_socket,
                 "listen on a unix socket at this path instead of --host/--port (its file permissions say who may "
                 "connect; its clients count as loopback)");
  app.add_flag("--isolate", f->isolate,
               "run the engine in a child process that is restarted when it dies (a GPU fault cannot take the server "
               "down); GET /engine shows its state");
  app.add_option("--model-pool", f->model_pool,
                 "serve every local model (`kettle ls`): each request's model field picks one, up to N run at once, "
                 "each in an engine child with 1/N of the device; the least recently used is stopped for another")
      ->check(CLI::Range(1, 64));
  app.add_option("--models-dir", f->models_dirs,
                 "a folder of model folders a --model-pool serves besides the Hugging Face cache; repeatable")
      ->check(CLI::ExistingDirectory)
      ->needs("--model-pool");
  app.add_option("--served-model-name", f->served_model_name,
                 "the model's id in answers and /v1/models (default: the model as given, a folder by its name)");
  app.add_option("--device-share", f->device_share,
                 "the share of the device's memory this server plans with (of a GPU's whole memory, of the host's "
                 "available RAM); a --model-pool divides it among its engines")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  app.add_option("--port", f->port, "TCP port")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--max-tokens", f->max_tokens,
                 "tokens generated when a request gives no max_tokens (0: until EOS or the context, as the KV budget allows)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  f->sampling.add_to(app);
  app.add_flag("--no-open", f->no_open, "do not open the chat page in a browser (opened only when a desktop is there)");
  app.add_option("--thinking", f->thinking, "enable_thinking for chat templates that read it, unless a request says")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--max-queue", f->max_queue, "requests that may wait for the engine; past it, 429")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--response-store", f->response_store_mb,
                 "MB of /v1/responses kept for previous_response_id and GET (the oldest go first)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--response-ttl", f->response_ttl, "seconds a stored /v1/responses response is kept")
      ->check(CLI::Range(int64_t{1}, int64_t{30} * 24 * 3600))
      ->capture_default_str();
  app.add_option("--drain-timeout", f->drain_seconds,
                 "seconds SIGINT/SIGTERM waits for in-flight requests before cancelling them")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--batch,--decode-concurrency", f->batch,
                 "generations decoded together (continuous batching); 1: strictly one at a time")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--prefill-chunk", f->prefill_chunk,
                 "prompt tokens prefilled per step beside the running decodes (long prompts never stall streams)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--kv-budget", f->kv_budget_gb,
                 "GB of paged KV cache (running generations and the prompt cache); a request whose KV does not fit "
                 "beside the running ones waits (default: of the memory left after the weights and the working "
                 "memory, 90% on a GPU, a quarter of free RAM on the CPU; `kettle fit` shows it)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--memory-budget", f->memory_budget_gb,
                 "GB per rank for weights + working memory + KV cache together; the KV cache gets what is left")
      ->check(CLI::PositiveNumber);
  app.add_flag("--paged-kv", f->paged_kv, "accepted for compatibility: the KV cache is always paged");
  app.add_option("--paged-kv-block-size", f->kv_block_size, "tokens per KV block (and per cached prefix block)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--prompt-cache", f->prompt_cache_gb,
                 "GB of KV blocks kept (inside the --kv-budget pool) for requests that share a prefix; 0 disables")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--api-key", f->api_keys,
                 "a key clients must send (Authorization: Bearer KEY or x-api-key: KEY) on every route but / and "
                 "/health; repeat for several keys (each its own prefix-cache scope)")
      ->envname("KETTLE_API_KEY");
  app.add_option("--cors-origin", f->cors_origins,
                 "a browser origin (e.g. https://app.example) allowed to call the API besides the chat page's own; "
                 "'*' allows any; repeatable");
  app.add_option("--allowed-host", f->allowed_hosts,
                 "a Host name clients may use besides loopback names and --host (DNS-rebinding guard); repeatable");
  app.add_flag("--literal-special-tokens", f->literal_special_tokens,
               "a control token's string inside a message's content (e.g. '<|im_start|>') is tokenized as plain "
               "text, so a client cannot open turns or roles of its own; off: as transformers' apply_chat_template");
  app.add_option("--max-connections", f->max_connections,
                 "open connections at most; more are answered 503 at once")
      ->check(CLI::Range(16, 1 << 20))
      ->capture_default_str();
  f->tensor_parallel.add_to(app);
  f->threads.add_to(app);
  f->device.add_to(app);
  f->kv_quant.add_to(app);
  f->speculation.add_to(app);
  CLI::Option* ssd = app.add_option("--ssd-cache", f->ssd_cache,
                                    "directory for the prompt cache's disk tier: cached prefixes spill there when evicted "
                                    "or idle and come back (also after a restart) instead of being prefilled");
  app.add_option("--ssd-cache-max", f->ssd_cache_max_gb, "GB the disk tier may hold (least recently used go first); 0: unlimited")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->needs(ssd);
  app.add_flag("--ssd-cache-verify", f->ssd_cache_verify, "check every tensor's checksum when reading from the disk tier "
               "(headers are always checked)")
      ->needs(ssd);
  app.add_option("--ssd-demote-idle", f->ssd_demote_idle,
                 "seconds a cached prefix stays in memory unused before it moves to the disk tier; 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->needs(ssd);
  app.add_option("--generation-checkpoint", f->generation_checkpoint,
                 "every N tokens a generation's state goes to the disk tier: the same request after a crash or a "
                 "restart resumes there and returns the tokens an uninterrupted run returns (greedy or seeded "
                 "requests without grammar or logprobs); 0: never")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str()
      ->needs(ssd);
  app.add_option("--shutdown-timeout", f->shutdown_seconds,
                 "seconds SIGINT/SIGTERM (after the drain) and POST /admin/cache/flush wait for the disk tier's writes")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return [f] { return run_serve(*f); };
}

}  // namespace kettle::cli
