// HttpServer: the routes over the event-driven HTTP layer (server/http/) —
// OpenAI routes, the Anthropic Messages route, /health, /stats, /metrics,
// /admin and the chat page. Quick routes answer on the event loop; generations
// run on a bounded pool of threads that turn requests into GenerationRequests for the
// Engine and relay its events as JSON or server-sent events. shutdown()
// drains in-flight requests before stopping.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/output_parser.h"
#include "engine/embedding.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "grammar/constraint.h"
#include "server/access_policy.h"
#include "server/completion_params.h"
#include "server/http/event_server.h"
#include "server/http/worker_pool.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/response_store.h"
#include "server/response_writer.h"
#include "tokenizer/tokenizer.h"

namespace kettle::server {

struct ServerConfig {
  std::string model_id;            // the folder name, reported by /v1/models
  int64_t context_length = 0;      // max_position_embeddings
  size_t weight_bytes = 0;         // as the checkpoint holds them (quantized: codes, scales, biases)
  QuantSummary quantization;       // bits 0: float weights
  int64_t vocab_size = 0;
  std::vector<int32_t> end_ids;    // the model's end-of-sequence ids (a constrained output ends with one)
  int64_t default_max_tokens = 0;  // for requests without max_tokens; 0: to EOS or the context (as KV allows)
  SamplingParams sampling;         // defaults for unset request fields
  bool thinking = true;            // enable_thinking for templates that read it, unless a request says
  int max_queue = 64;              // generations waiting past this many: 429
  double flush_timeout_seconds = 120;  // POST /admin/cache/flush waits this long for the disk at most
  int batch = 8;                   // generations the engine runs at once (sizes the HTTP thread pool)
  http::ServerLimits http;          // connections, deadlines, head and body sizes
  AccessConfig access;              // API keys, CORS origins, Host names
  bool literal_special_tokens = false;  // control-token strings in message content stay text
  size_t response_store_bytes = size_t{64} << 20;  // /v1/responses kept for previous_response_id and GET
  int64_t response_ttl_seconds = 3600;
  // An embedding model: /v1/embeddings answers, and the generation routes refuse.
  std::optional<EmbeddingModel> embedding;
};

class HttpServer {
 public:
  // tokenizer and chat_template must outlive the server; chat_template may be null
  // (then the chat routes answer 400).
  HttpServer(ServerConfig config, const Tokenizer& tokenizer, const ChatTemplate* chat_template, Engine& engine);
  ~HttpServer();

  // Binds (throws kettle::Error naming host:port on failure); then listen() blocks until shutdown().
  void bind(const std::string& host, int port);
  void bind_unix(const std::string& path) { events_.bind_unix(path); }
  int port() const { return events_.port(); }
  void listen();
  // Refuses new generations, waits up to drain_seconds for the in-flight ones,
  // cancels what is left with an error event, then stops the listener.
  void shutdown(double drain_seconds);

 private:
  enum class Api { kChat, kCompletion, kMessages, kResponses };
  struct Prepared;  // a checked request, its prompt ids and how to read its output

  void route(const std::shared_ptr<http::Exchange>& exchange);  // on the event loop
  void answer_quick(http::Exchange& exchange, const std::string& path);
  void answer_stored_response(http::Exchange& exchange, const std::string& id);  // GET / DELETE /v1/responses/{id}
  ModelCard model_card() const;  // what /v1/models tells of the served model
  // Compiled constraints over this model's vocabulary (made on the first constrained request).
  grammar::ConstraintCache& constraints();
  void handle_generation(http::Exchange& exchange, Api api, int key_index);
  void handle_embeddings(http::Exchange& exchange);  // embeddings_handler.cpp
  // The engine requests of a /v1/embeddings body (ApiError naming what is wrong).
  std::vector<GenerationRequest> embedding_requests(const http::Request& req, bool& base64, int64_t& dimensions);
  Prepared prepare(const http::Request& req, Api api, int key_index);
  // The tokens a request without max_tokens may generate after n_prompt (`room` fit the
  // context): --max-tokens when set, else all of it that the KV admission can hold.
  int64_t default_max_tokens(int64_t n_prompt, int64_t room) const;
  std::unique_ptr<ResponseWriter> response_writer(Api api, const CompletionParams& params) const;
  void reply_whole(http::Exchange& exchange, Prepared& prepared);
  void reply_stream(http::Exchange& exchange, Prepared& prepared);
  void reply_error(http::Exchange& exchange, Api api, const ApiError& error, const char* route);
  // An error in the API's own shape (Anthropic's for /v1/messages), with Retry-After / WWW-Authenticate.
  static http::Response error_response(const ApiError& error, Api api = Api::kChat);
  void request_began();
  void request_ended();

  ServerConfig config_;
  const Tokenizer& tokenizer_;
  const ChatTemplate* chat_template_;
  Engine& engine_;
  AccessPolicy access_;
  std::vector<std::string> special_strings_;  // the tokenizer's special tokens, for --literal-special-tokens
  Metrics metrics_;
  ResponseStore responses_;  // /v1/responses by id
  http::EventServer events_;
  http::WorkerPool workers_;
  std::mutex prompt_mutex_;  // render + encode, from any handler thread
  std::once_flag constraints_once_;
  std::unique_ptr<grammar::ConstraintCache> constraints_;
  std::mutex active_mutex_;
  std::condition_variable active_changed_;
  int active_ = 0;  // generations whose response is not finished
  std::atomic<bool> draining_{false};
};

}  // namespace kettle::server
