// ModelDrafter (--draft-kind model): a smaller model with the target's vocabulary
// drafts greedily. Each sequence has a cache of its own in the draft's pool, holding
// the context the draft last saw; before drafting, the rejected drafts' positions are
// truncated, what the target accepted since is fed in one forward (its last row gives
// the first draft), then one single-token forward per further draft.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/speculation.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace kettle {

class ModelDrafter final : public Drafter {
 public:
  // Loads the draft from `folder` onto `backend`; refuses (kInvalidArgument) a draft whose
  // vocabulary differs from the target's (its size, or any token's string where both
  // folders have a tokenizer). The draft's caches may be rolled back `max_drafts` + 1; its
  // pool holds at most `kv_bytes` (0: no cap): a sequence that finds it full is not drafted for.
  ModelDrafter(const std::string& folder, const Model& target, const Tokenizer* target_tokenizer, Backend& backend,
               int max_drafts, size_t kv_bytes);
  std::vector<int32_t> propose(const Sequence& seq, int k) override;
  void forget(const Sequence& seq) override { tracks_.erase(&seq); }

 private:
  static constexpr int64_t kCatchUpChunk = 2048;  // tokens per forward when the draft catches up
  std::vector<int32_t> draft(const Sequence& seq, int k);

  struct Track {
    KvCache kv;
    std::vector<int32_t> fed;  // the tokens whose KV the draft's cache holds, in order
  };

  std::unique_ptr<Model> model_;
  StandaloneRunner runner_;
  int max_drafts_;
  bool warned_full_ = false;
  std::vector<float> catch_up_logits_;  // a catch-up chunk's logits, made on the first long catch-up
  std::unordered_map<const Sequence*, Track> tracks_;
};

}  // namespace kettle
