// What the engine is asked and what it answers, with nothing of the model or
// the KV store in it: a GenerationRequest (a tokenized prompt and how to
// continue it), the GenerationSink its output goes to (text pieces as they
// become safe to show, the tokens behind them, then one end), and the end's
// report. The server's event channel, the CLI's printer and the tests are sinks.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "grammar/constraint.h"
#include "model/embedding_spec.h"
#include "model/generation_config.h"
#include "util/error.h"

namespace kettle {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;  // 0: the prompt is only run (scored), nothing is drawn
  // Each prompt position's log-probability of the prompt token after it comes back
  // (GenerationOutput::prompt_logprobs, log-softmax in double of the raw logits): what
  // perplexity scores. Every position is computed, so no cached prefix is adopted.
  bool prompt_logprobs = false;
  // Warpers, penalties, logit_bias and logprobs (sampler.h); checked before any work.
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (needs a tokenizer); the model's end-of-sequence ids always stop
  bool ignore_eos = false;
  // Constrained decoding: every drawn token keeps the output inside this grammar (over the
  // tokenizer's vocabulary, with the model's end ids), and the generation stops once the
  // output is a whole sentence that nothing may extend. Null: free text.
  std::shared_ptr<grammar::Constraint> constraint;
  // An embedding (of an embedding model, whose runner returns hidden states): the prompt is
  // run, nothing is drawn (max_tokens 0), and the final norm's hidden states pooled so,
  // then scaled to unit length when `normalize`, come back as GenerationOutput::embedding.
  // kNone: a generation (refused by an embedding model).
  Pooling pooling = Pooling::kNone;
  bool normalize = false;
  uint64_t cache_scope = 0;       // the prefix cache shares blocks only within one scope
  std::string route;              // the API it came through (part of a checkpoint's identity)
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();
};

// One sampled token as a client sees it (text only when the engine has a tokenizer).
struct TokenReport {
  int32_t id = 0;
  std::string text;
  float logprob = 0.0f;
  std::vector<TokenReport> top;  // the most likely alternatives, when asked for
};

struct GenerationOutput {
  std::string text;                  // the text now safe to show (may be empty: a stop string may be forming)
  std::span<const int32_t> ids;      // the tokens sampled since the last output (valid during the call)
  std::vector<TokenReport> logprobs;  // those tokens with their log-probabilities, when the request asked
  // GenerationRequest::prompt_logprobs: log p(prompt[first_position + i + 1] | prompt up to
  // first_position + i) for the positions this step ran.
  std::vector<double> prompt_logprobs;
  int64_t first_position = 0;
  std::vector<float> embedding;  // GenerationRequest::pooling: the pooled vector, once, after the prompt ran
};

struct GenerationEnd {
  std::string finish_reason;  // "stop", "length", "cancelled" or "error"
  std::string error;          // cancelled or error: why
  ErrorCategory error_category = ErrorCategory::kInternal;  // error: what kind (a CLI's exit code)
  std::string stop_sequence;  // the stop string that ended it, if one did
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  bool speculative = false;   // the engine drafted (--draft-kind): drafted and accepted below are reported
  int64_t drafted = 0;        // tokens drafted for it
  int64_t accepted = 0;       // of them, accepted
  double queue_seconds = 0.0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // after the first token
  bool ok() const { return finish_reason == "stop" || finish_reason == "length"; }
};

// Called on the engine's thread; cancelled() may be read at any time.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void on_output(GenerationOutput output) = 0;
  virtual void on_end(const GenerationEnd& end) = 0;
  virtual bool cancelled() const { return false; }
};

// Sampling defaults from generation_config.json, as transformers would apply them.
SamplingParams default_sampling(const GenerationDefaults& defaults);

}  // namespace kettle
