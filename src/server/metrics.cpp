#include "server/metrics.h"

#include <fmt/format.h>

namespace kettle::server {

Metrics::Metrics() : started_(std::chrono::steady_clock::now()) {}

void Metrics::record_request(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
}

void Metrics::record_generation(int64_t prompt_tokens, int64_t completion_tokens, double prefill_seconds,
                                double decode_seconds, double ttft_seconds) {
  std::lock_guard lock(mutex_);
  ++generations_;
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
  prefill_seconds_ += prefill_seconds;
  decode_seconds_ += decode_seconds;
  ttft_sum_ += ttft_seconds;
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    if (ttft_seconds <= kTtftBuckets[i]) ++ttft_counts_[i];
  // decode_seconds spans the tokens after the first
  if (completion_tokens > 1 && decode_seconds > 0.0)
    last_decode_tokens_per_second_ = static_cast<double>(completion_tokens - 1) / decode_seconds;
}

namespace {

nlohmann::json ssd_stats(const SsdLoad& s) {
  if (!s.enabled) return {{"enabled", false}};
  return {{"enabled", true},
          {"spilling", s.spilling},
          {"scanning", s.scanning},
          {"entries", s.entries},
          {"bytes", s.bytes},
          {"max_bytes", s.max_bytes},
          {"hits", s.hits},
          {"restores", s.restores},
          {"restore_bytes", s.restore_bytes},
          {"restore_bytes_per_second", s.restore_seconds > 0 ? static_cast<double>(s.restore_bytes) / s.restore_seconds : 0.0},
          {"written", s.written},
          {"written_bytes", s.written_bytes},
          {"spill_queue", s.queued},
          {"spill_queue_bytes", s.queued_bytes},
          {"dropped", s.dropped},
          {"errors", s.errors},
          {"removed", s.removed},
          {"checkpoints", s.checkpoints},
          {"checkpoints_written", s.checkpoints_written},
          {"resumed", s.resumed}};
}

nlohmann::json speculation_stats(const SpeculationLoad& s) {
  return {{"kind", s.kind},
          {"max_drafts", s.max_drafts},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"acceptance", s.drafted > 0 ? static_cast<double>(s.accepted) / static_cast<double>(s.drafted) : 0.0},
          {"verifies", s.verifies},
          {"tokens_per_verify", s.verifies > 0 ? static_cast<double>(s.emitted) / static_cast<double>(s.verifies) : 0.0}};
}

}  // namespace

nlohmann::json Metrics::stats(const EngineLoad& load, const std::string& model_id) const {
  std::lock_guard lock(mutex_);
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  nlohmann::json by_status = nlohmann::json::object();
  int64_t total = 0;
  for (const auto& [key, count] : requests_) {
    by_status[std::to_string(key.second)] = by_status.value(std::to_string(key.second), int64_t{0}) + count;
    total += count;
  }
  return {{"model", model_id},
          {"uptime_seconds", uptime},
          {"requests", {{"running", load.running}, {"queued", load.queued}, {"total", total}, {"by_status", by_status}}},
          {"kv",
           {{"bytes_in_use", load.kv.bytes_reserved},
            {"budget_bytes", load.kv.budget_bytes},
            {"block_size", load.kv.block_size},
            {"blocks_used", load.kv.blocks_used},
            {"blocks_free", load.kv.blocks_free},
            {"pool_bytes_used", load.kv.bytes_used},
            {"pool_bytes_allocated", load.kv.bytes_allocated},
            {"quant", load.kv.quant},
            {"bytes_per_token", load.kv.bytes_per_token}}},
          {"generations", generations_},
          {"tokens", {{"prompt", prompt_tokens_}, {"completion", completion_tokens_}}},
          {"prefill_tokens_per_second", prefill_seconds_ > 0 ? static_cast<double>(prompt_tokens_) / prefill_seconds_ : 0.0},
          {"decode_tokens_per_second", decode_seconds_ > 0 ? static_cast<double>(completion_tokens_ - generations_) / decode_seconds_ : 0.0},
          {"last_decode_tokens_per_second", last_decode_tokens_per_second_},
          {"mean_time_to_first_token_seconds", generations_ > 0 ? ttft_sum_ / static_cast<double>(generations_) : 0.0},
          {"prefix_cache",
           {{"lookups", load.prefix_cache.lookups},
            {"hits", load.prefix_cache.hits},
            {"cached_tokens", load.prefix_cache.cached_tokens},
            {"entries", load.prefix_cache.entries},
            {"bytes", load.prefix_cache.bytes},
            {"held_bytes", load.prefix_cache.held_bytes},
            {"capacity_bytes", load.prefix_cache.capacity_bytes}}},
          {"ssd_cache", ssd_stats(load.ssd)},
          {"speculation", speculation_stats(load.speculation)}};
}

std::string Metrics::prometheus(const EngineLoad& load, const std::string& model_id) const {
  std::lock_guard lock(mutex_);
  const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const std::string model = fmt::format("model=\"{}\"", model_id);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // A metric with one sample, labelled with the model.
  auto single = [&](const char* name, const char* type, const char* help, const std::string& value) {
    metric(name, type, help);
    out += fmt::format("{}{{{}}} {}\n", name, model, value);
  };
  single("kettle_uptime_seconds", "gauge", "Seconds since the server started.", fmt::format("{:.3f}", uptime));
  single("kettle_requests_running", "gauge", "Generations running on the engine.", std::to_string(load.running));
  single("kettle_requests_queued", "gauge", "Generations waiting for the engine.", std::to_string(load.queued));
  metric("kettle_http_requests_total", "counter", "Finished generation requests by route and HTTP status.");
  for (const auto& [key, count] : requests_)
    out += fmt::format("kettle_http_requests_total{{{},route=\"{}\",status=\"{}\"}} {}\n", model, key.first,
                       key.second, count);
  single("kettle_prompt_tokens_total", "counter", "Prompt tokens prefilled.", std::to_string(prompt_tokens_));
  single("kettle_generation_tokens_total", "counter", "Tokens generated.", std::to_string(completion_tokens_));
  single("kettle_prefill_seconds_total", "counter", "Seconds spent in prefill.",
         fmt::format("{:.6f}", prefill_seconds_));
  single("kettle_decode_seconds_total", "counter", "Seconds spent decoding after the first token.",
         fmt::format("{:.6f}", decode_seconds_));
  single("kettle_kv_bytes_in_use", "gauge", "KV cache bytes reserved by running generations.",
         std::to_string(load.kv.bytes_reserved));
  single("kettle_kv_blocks_used", "gauge", "KV blocks held by sequences and the prefix cache.",
         std::to_string(load.kv.blocks_used));
  single("kettle_kv_blocks_free", "gauge", "KV blocks free, or to be had by growing the pool to its cap.",
         std::to_string(load.kv.blocks_free));
  single("kettle_prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.",
         std::to_string(load.prefix_cache.lookups));
  single("kettle_prefix_cache_hits_total", "counter", "Prompts that reused a cached prefix.",
         std::to_string(load.prefix_cache.hits));
  single("kettle_prefix_cache_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
         std::to_string(load.prefix_cache.cached_tokens));
  single("kettle_prefix_cache_bytes", "gauge", "KV bytes held by the prefix cache.",
         std::to_string(load.prefix_cache.bytes));
  if (const SsdLoad& d = load.ssd; d.enabled) {
    single("kettle_ssd_cache_entries", "gauge", "Prefix blocks on disk.", std::to_string(d.entries));
    single("kettle_ssd_cache_bytes", "gauge", "Bytes of prefix blocks on disk.", std::to_string(d.bytes));
    single("kettle_ssd_cache_hits_total", "counter", "Prompts that found prefix blocks on disk.", std::to_string(d.hits));
    single("kettle_ssd_cache_restores_total", "counter", "Prefix blocks read back from disk.", std::to_string(d.restores));
    single("kettle_ssd_cache_restore_bytes_total", "counter", "Bytes read back from disk.", std::to_string(d.restore_bytes));
    single("kettle_ssd_cache_restore_seconds_total", "counter", "Seconds spent reading prefix blocks back.",
           fmt::format("{:.6f}", d.restore_seconds));
    single("kettle_ssd_cache_written_total", "counter", "Prefix blocks written to disk.", std::to_string(d.written));
    single("kettle_ssd_cache_spill_queue", "gauge", "Prefix blocks waiting to be written.", std::to_string(d.queued));
    single("kettle_ssd_cache_spill_queue_bytes", "gauge", "Bytes waiting to be written.", std::to_string(d.queued_bytes));
    single("kettle_ssd_cache_dropped_total", "counter", "Prefix blocks not written (queue full, disk refused, shutdown).",
           std::to_string(d.dropped));
    single("kettle_ssd_cache_errors_total", "counter", "Failed disk reads and writes, bad files found.",
           std::to_string(d.errors));
    single("kettle_generation_checkpoints", "gauge", "Generation checkpoints on disk.", std::to_string(d.checkpoints));
    single("kettle_generations_resumed_total", "counter", "Generations resumed from a checkpoint.", std::to_string(d.resumed));
    single("kettle_ssd_cache_spilling", "gauge", "1 while blocks are written to disk; 0 once the disk refused.",
           d.spilling ? "1" : "0");
  }
  if (const SpeculationLoad& s = load.speculation; s.kind != "none") {
    single("kettle_speculation_drafted_tokens_total", "counter", "Tokens drafted for verification (--draft-kind).",
           std::to_string(s.drafted));
    single("kettle_speculation_accepted_tokens_total", "counter", "Drafted tokens the model accepted.",
           std::to_string(s.accepted));
    single("kettle_speculation_verifies_total", "counter", "Verify steps run (a sequence's drafts checked at once).",
           std::to_string(s.verifies));
    single("kettle_speculation_verify_tokens_total", "counter", "Tokens the verify steps produced.",
           std::to_string(s.emitted));
  }
  metric("kettle_time_to_first_token_seconds", "histogram", "Time from request to first generated token.");
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    out += fmt::format("kettle_time_to_first_token_seconds_bucket{{{},le=\"{}\"}} {}\n", model, kTtftBuckets[i],
                       ttft_counts_[i]);
  out += fmt::format("kettle_time_to_first_token_seconds_bucket{{{},le=\"+Inf\"}} {}\n", model, generations_);
  out += fmt::format("kettle_time_to_first_token_seconds_sum{{{}}} {:.6f}\n", model, ttft_sum_);
  out += fmt::format("kettle_time_to_first_token_seconds_count{{{}}} {}\n", model, generations_);
  return out;
}

}  // namespace kettle::server
