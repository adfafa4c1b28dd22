#include "engine/draft_model.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "engine/sequence.h"
#include "util/error.h"
#include "util/log.h"

namespace kettle {
namespace {

// The draft must spell every id as the target does, or its drafts mean other tokens.
void check_same_vocabulary(const std::string& folder, const Model& draft, const Model& target,
                           const Tokenizer* target_tokenizer) {
  if (draft.spec.vocab_size != target.spec.vocab_size)
    fail(ErrorCategory::kInvalidArgument, "--draft-model {}: a vocabulary of {} ids, the model's has {}", folder,
         draft.spec.vocab_size, target.spec.vocab_size);
  const std::filesystem::path file = std::filesystem::path(folder) / "tokenizer.json";
  if (target_tokenizer == nullptr || !std::filesystem::exists(file)) return;
  const Tokenizer tokenizer = Tokenizer::from_file(folder);
  if (tokenizer.vocab_size() != target_tokenizer->vocab_size())
    fail(ErrorCategory::kInvalidArgument, "--draft-model {}: its tokenizer has {} tokens, the model's {}", folder,
         tokenizer.vocab_size(), target_tokenizer->vocab_size());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.id_to_token(id) != target_tokenizer->id_to_token(id))
      fail(ErrorCategory::kInvalidArgument, "--draft-model {}: token {} is '{}' there and '{}' in the model's tokenizer",
           folder, id, tokenizer.id_to_token(id), target_tokenizer->id_to_token(id));
}

}  // namespace

ModelDrafter::ModelDrafter(const std::string& folder, const Model& target, const Tokenizer* target_tokenizer,
                           Backend& backend, int max_drafts, size_t kv_bytes)
    : model_(std::make_unique<Model>(load_model(folder))), max_drafts_(max_drafts) {
  if (model_->spec.hidden_output)
    fail(ErrorCategory::kInvalidArgument, "--draft-model {}: an embedding model has no logits to draft from", folder);
  check_same_vocabulary(folder, *model_, target, target_tokenizer);
  KvPool::Options pool;
  pool.max_bytes = kv_bytes;
  runner_ = make_standalone_runner(*model_, {&backend}, pool);
}

std::vector<int32_t> ModelDrafter::propose(const Sequence& seq, int k) {
  try {
    return draft(seq, k);
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::kResourceExhausted) throw;
    if (!std::exchange(warned_full_, true)) log::warn("draft model: its KV cache is full; sequences go undrafted: {}", e.what());
    tracks_.erase(&seq);  // its blocks go back; drafted for again from scratch once there is room
    return {};
  }
}

std::vector<int32_t> ModelDrafter::draft(const Sequence& seq, int k) {
  auto [it, fresh] = tracks_.try_emplace(&seq, Track{runner_->new_cache(), {}});
  Track& track = it->second;
  if (fresh) track.kv.set_rollback_margin(max_drafts_ + 1);
  const std::vector<int32_t>& context = seq.tokens();
  // What the draft saw that the context still holds; the rest (rejected drafts) goes.
  const auto same = std::mismatch(track.fed.begin(), track.fed.end(), context.begin(), context.end());
  auto keep = static_cast<int64_t>(same.first - track.fed.begin());
  keep = std::min<int64_t>(keep, static_cast<int64_t>(context.size()) - 1);  // the last token is fed again
  track.kv.truncate(keep);
  track.fed.resize(static_cast<size_t>(keep));
  std::vector<int32_t> drafts;
  // What is new, in chunks (a long prompt's first drafts would otherwise be one huge forward).
  const auto end = static_cast<int64_t>(context.size());
  for (; end - keep > kCatchUpChunk; keep += kCatchUpChunk) {
    catch_up_logits_.resize(static_cast<size_t>(model_->spec.vocab_size));  // unread: only the cache matters
    runner_->forward(context.data() + keep, kCatchUpChunk, track.kv, LogitsFor::kLastToken, catch_up_logits_.data());
    track.fed.insert(track.fed.end(), context.begin() + keep, context.begin() + keep + kCatchUpChunk);
  }
  int32_t next = runner_->forward_greedy(context.data() + keep, end - keep, track.kv);
  track.fed.insert(track.fed.end(), context.begin() + keep, context.end());
  drafts.push_back(next);
  while (static_cast<int>(drafts.size()) < k) {
    next = runner_->forward_greedy(&next, 1, track.kv);
    track.fed.push_back(drafts.back());
    drafts.push_back(next);
  }
  return drafts;
}

}  // namespace kettle
