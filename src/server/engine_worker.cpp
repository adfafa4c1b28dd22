// The engine thread: tokens → text with StreamDecoder, stop strings with
// StopMatcher, one event per emitted piece; a cancelled channel ends the
// generation before the next decode step.
#include "server/engine_worker.h"

#include <algorithm>

#include "engine/generator.h"
#include "tokenizer/stream_decoder.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle::server {

EngineWorker::EngineWorker(const Model& model, const Tokenizer& tokenizer, std::unique_ptr<Backend> backend,
                           Options options)
    : model_(model), tokenizer_(tokenizer), backend_(std::move(backend)) {
  transformer_ = std::make_unique<Transformer>(model_, *backend_);
  // A RoPE that changes with the sequence length (dynamic NTK) rotates cached keys for
  // another length than a fresh run would: no reuse for those models.
  bool length_dependent = false;
  for (const RopeSpec& rope : model_.spec.ropes) length_dependent = length_dependent || rope_depends_on_length(rope);
  if (options.prompt_cache_bytes > 0 && !length_dependent)
    prefix_cache_.emplace(options.prompt_cache_bytes, options.prompt_cache_block);
  thread_ = std::thread([this] { loop(); });
}

EngineWorker::~EngineWorker() { stop(); }

void EngineWorker::submit(Job job) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(job));
      wake_.notify_one();
      return;
    }
  }
  job.channel->push(Event::error("the server is shutting down"));
}

EngineLoad EngineWorker::load() {
  std::lock_guard lock(mutex_);
  return {running_ ? 1 : 0, static_cast<int>(queue_.size()), prefix_cache_ ? prefix_cache_->stats() : PrefixCacheStats{}};
}

void EngineWorker::cancel_all(const std::string& reason) {
  std::lock_guard lock(mutex_);
  cancel_reason_ = reason;
  if (running_) running_->cancel();
  for (Job& job : queue_) job.channel->cancel();
}

void EngineWorker::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        job.channel->push(Event::error("the server is shutting down"));
        continue;
      }
      running_ = job.channel;
    }
    try {
      run(job);
    } catch (const std::exception& e) {
      log::warn("request failed: {}", e.what());
      job.channel->push(Event::error(e.what()));
    }
    std::lock_guard lock(mutex_);
    running_.reset();
  }
}

void EngineWorker::run(Job& job) {
  EventChannel& channel = *job.channel;
  const double queue_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - job.submitted).count();
  GenerationRequest request;
  request.prompt = job.prompt;
  request.max_tokens = job.max_tokens;
  request.sampling = job.sampling;
  if (!job.ignore_eos) request.stop_ids = model_.generation.eos_token_ids;

  StreamDecoder decoder(tokenizer_);
  StopMatcher matcher(job.stop);
  auto emit = [&](std::string text, std::vector<TokenLogprob> logprobs = {}) {
    if (text.empty() && logprobs.empty()) return;
    Event e;
    e.text = std::move(text);
    e.logprobs = std::move(logprobs);
    channel.push(std::move(e));
  };
  auto token_text = [&](int32_t id) { return tokenizer_.decode({id}); };
  auto on_token = [&](const SampledToken& sampled) {
    const int32_t token = sampled.id;
    if (matcher.stopped()) return;
    bool is_eos = std::find(request.stop_ids.begin(), request.stop_ids.end(), token) != request.stop_ids.end();
    if (is_eos) return;
    std::vector<TokenLogprob> logprobs;
    if (job.sampling.logprobs) {
      TokenLogprob lp{token, token_text(token), sampled.logprob, {}};
      for (const kettle::TokenLogprob& alt : sampled.top) lp.top.push_back({alt.id, token_text(alt.id), alt.logprob});
      logprobs.push_back(std::move(lp));
    }
    emit(matcher.push(decoder.push(token)), std::move(logprobs));
  };
  request.should_stop = [&] { return channel.cancelled() || matcher.stopped(); };

  std::optional<PrefixCache::Lease> lease;
  if (prefix_cache_) {
    std::lock_guard lock(mutex_);
    lease = prefix_cache_->take(job.prompt);
  }
  KvCache kv = lease ? std::move(lease->kv) : transformer_->new_cache();
  request.kv = &kv;
  GenerationResult result = generate(*transformer_, request, on_token);
  if (prefix_cache_) {  // the cache holds the prompt and every sampled token but the last
    std::vector<int32_t> tokens = job.prompt;
    tokens.insert(tokens.end(), result.tokens.begin(), result.tokens.end());
    tokens.resize(static_cast<size_t>(kv.length()));
    std::lock_guard lock(mutex_);
    prefix_cache_->put(std::move(tokens), std::move(kv));
  }
  if (channel.cancelled()) {
    std::string reason;
    {
      std::lock_guard lock(mutex_);
      reason = cancel_reason_.empty() ? "the client disconnected" : cancel_reason_;
    }
    log::info("generation cancelled after {} tokens: {}", result.tokens.size(), reason);
    channel.push(Event::error("generation cancelled: " + reason));
    return;
  }
  Event done;
  done.kind = Event::Kind::kDone;
  done.finish_reason = result.finish_reason;
  if (matcher.stopped()) {
    done.finish_reason = "stop";
    done.stop_sequence = matcher.matched();
  } else {
    emit(matcher.push(decoder.finish()));
    emit(matcher.finish());
  }
  done.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  done.cached_tokens = result.cached_tokens;
  done.completion_tokens = static_cast<int64_t>(result.tokens.size());
  done.queue_seconds = queue_seconds;
  done.prefill_seconds = result.prefill_ms / 1000.0;
  done.decode_seconds = result.decode_ms / 1000.0;
  channel.push(std::move(done));
}

}  // namespace kettle::server
