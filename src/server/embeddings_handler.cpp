// POST /v1/embeddings: checks the request, tokenizes each text after the model's
// prompt, submits every input to the engine (they batch like any prompts), and
// answers once all are pooled — or with the first input's error, naming it. A
// client that goes away cancels what is still running.
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "engine/embedding.h"
#include "server/embeddings_protocol.h"
#include "server/http_server.h"
#include "server/request_fields.h"
#include "server/request_schema.h"
#include "util/error.h"

namespace kettle::server {

using namespace std::chrono_literals;

namespace {

constexpr const char* kRoute = "/v1/embeddings";

// Every input's embedding and end, gathered for the waiting HTTP thread.
class EmbeddingGather {
 public:
  explicit EmbeddingGather(size_t n) : embeddings_(n), ends_(n), remaining_(n) {}

  class Slot final : public GenerationSink {
   public:
    Slot(std::shared_ptr<EmbeddingGather> gather, size_t index) : gather_(std::move(gather)), index_(index) {}
    void on_output(GenerationOutput output) override {
      if (!output.embedding.empty()) gather_->embeddings_[index_] = std::move(output.embedding);
    }
    void on_end(const GenerationEnd& end) override { gather_->ended(index_, end); }
    bool cancelled() const override { return gather_->cancelled_.load(); }

   private:
    std::shared_ptr<EmbeddingGather> gather_;
    size_t index_;
  };

  // True once every input ended (waits at most `timeout`).
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, timeout, [&] { return remaining_ == 0; });
  }
  void cancel() { cancelled_.store(true); }
  bool cancelled_by_client() const { return cancelled_.load(); }
  std::vector<std::vector<float>>& embeddings() { return embeddings_; }
  const std::vector<GenerationEnd>& ends() const { return ends_; }

 private:
  void ended(size_t index, const GenerationEnd& end) {
    std::lock_guard lock(mutex_);
    ends_[index] = end;
    if (--remaining_ == 0) done_.notify_all();
  }

  std::vector<std::vector<float>> embeddings_;
  std::vector<GenerationEnd> ends_;
  size_t remaining_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

std::vector<GenerationRequest> HttpServer::embedding_requests(const http::Request& req, bool& base64,
                                                              int64_t& dimensions) {
  if (!config_.embedding)
    throw ApiError(400, fmt::format("{} is not an embedding model: /v1/embeddings needs one (a sentence-transformers "
                                    "folder with a Pooling module)", config_.model_id),
                   "model", "model_not_embedding");
  const EmbeddingModel& model = *config_.embedding;
  const ordered_json body = parse_body(req.body);
  check_fields(body, Route::kEmbeddings);
  EmbeddingsParams params = parse_embeddings_request(body, config_.vocab_size);
  std::string prompt;
  try {
    check_dimensions(model, params.dimensions);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "dimensions");
  }
  try {
    prompt = embedding_prompt(model, params.prompt_name);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "prompt_name");
  }
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < params.count(); ++i) {
    std::vector<int32_t> ids;
    if (params.texts.empty()) {
      ids = std::move(params.token_inputs[i]);
    } else {
      std::lock_guard lock(prompt_mutex_);
      // As sentence-transformers: the prompt, then the text, tokenized with special tokens.
      ids = tokenizer_.encode(prompt + params.texts[i], true);
    }
    try {
      requests.push_back(embedding_request(model, std::move(ids), i));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), params.count() == 1 ? "input" : fmt::format("input[{}]", i),
                     "context_length_exceeded");
    }
  }
  if (engine_.load().queued >= config_.max_queue)
    throw ApiError(429, fmt::format("the server is busy: {} requests are already waiting; retry shortly", config_.max_queue));
  base64 = params.base64;
  dimensions = params.dimensions;
  return requests;
}

void HttpServer::handle_embeddings(http::Exchange& exchange) {
  std::vector<GenerationRequest> requests;
  bool base64 = false;
  int64_t dimensions = 0;
  try {
    if (draining_) throw ApiError(503, "the server is shutting down");
    requests = embedding_requests(exchange.request(), base64, dimensions);
  } catch (const ApiError& e) {
    metrics_.record_request(kRoute, e.status());
    return exchange.reply(error_response(e));
  }
  request_began();
  struct Ended {
    HttpServer* server;
    ~Ended() { server->request_ended(); }
  } ended{this};
  auto gather = std::make_shared<EmbeddingGather>(requests.size());
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
    engine_.submit(std::move(requests[i]), std::make_shared<EmbeddingGather::Slot>(gather, i));
  }
  while (!gather->wait(100ms))  // a client that left stops what is still running
    if (!gather->cancelled_by_client() && exchange.client_gone()) gather->cancel();
  for (size_t i = 0; i < gather->ends().size(); ++i) {
    const GenerationEnd& end = gather->ends()[i];
    if (end.ok() && !gather->embeddings()[i].empty()) continue;
    const int status = gather->cancelled_by_client() ? 499 : draining_ ? 503 : end.error_category == ErrorCategory::kInternal ? 500 : 400;
    metrics_.record_request(kRoute, status);
    return exchange.reply(error_response(
        ApiError(status, fmt::format("input {}: {}", i, end.error.empty() ? "no embedding came back" : end.error))));
  }
  std::vector<std::vector<float>>& embeddings = gather->embeddings();
  for (std::vector<float>& e : embeddings) e = truncate_embedding(std::move(e), dimensions);
  metrics_.record_request(kRoute, 200);
  exchange.reply(http::Response(200, "application/json", embeddings_response(config_.model_id, embeddings, base64, prompt_tokens)));
}

}  // namespace kettle::server
