// Tensor parallelism (issue 8): one rank's part of a model split Megatron-style
// over `ranks` devices. Column-parallel: q, k and v (heads split: a rank keeps
// n_heads / ranks query heads and n_kv_heads / ranks KV heads, so its KV cache
// holds only those), gate and up (intermediate split). Row-parallel: o_proj and
// down, whose partial outputs the ranks sum (Collective::all_reduce_sum) before
// the residual add; their biases stay on rank 0. The LM head is split by
// vocabulary and the ranks gather the logits. Norms and the embedding table
// are replicated (the table is read one row per token). MoE layers do not split
// yet.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/collective.h"
#include "kv/kv_pool.h"
#include "model/model.h"

namespace kettle {

struct ModelShard {
  Model model;                  // this rank's spec (vocab_size: its slice) and weights
  int rank = 0, ranks = 1;
  int64_t vocab_begin = 0;      // this rank's first LM-head row
  int64_t full_vocab = 0;
  std::vector<std::vector<uint8_t>> owned;  // column slices copied out of the checkpoint
};

// Throws kettle::Error (kUnsupported) naming what does not divide by `ranks`.
void check_splittable(const ModelSpec& spec, int ranks);

// Rank `rank` of `ranks`: views into `model`'s tensors where a slice is contiguous,
// copies (held in the shard) where it is not. `model` must outlive the shard.
ModelShard shard_model(const Model& model, int rank, int ranks);

// What a DecoderRunner running one shard needs: its rank's collective, its LM-head slice
// and, when the ranks share one block bookkeeping (TensorParallelRunner), that pool.
struct TensorParallel {
  Collective* collective = nullptr;  // nullptr: the whole model on one device
  int64_t vocab_begin = 0;
  int64_t full_vocab = 0;
  bool shared_pool = false;  // the ranks share one pool: its owner reserves and advances the caches, once for all
  int pool_rank = 0;         // this rank's buffers in the pool (0 in a pool of its own)
};

inline TensorParallel tensor_parallel_of(const ModelShard& shard, Collective& collective, bool shared_pool = false) {
  return TensorParallel{&collective, shard.vocab_begin, shard.full_vocab, shared_pool, shared_pool ? shard.rank : 0};
}

}  // namespace kettle
