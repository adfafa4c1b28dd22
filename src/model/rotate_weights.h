// `kettle convert --rotate-weights`: a random Hadamard rotation of the residual
// stream folded into the weights (QuaRot's R1), which spreads outlier features
// over every channel before quantizing and leaves the float model's function as
// it was.
//
// With Q = diag(s) · H / √n orthogonal (s random signs from the seed, H a
// Hadamard matrix of the hidden size n), the residual h becomes h · Q. RMSNorm
// commutes with Q once its weight γ is folded into the projections after it
// (and set to ones); so every projection that reads the residual (q, k, v, gate,
// up, the LM head) becomes W · diag(γ) · Q, every one that writes it (o, down:
// weight and bias) Qᵀ · W, the embedding E · Q. A tied LM head is untied (it
// takes the final norm's γ, the embedding does not). Hadamard sizes: 2^k times 1
// or a Paley order (12, 20, 28, 36, 44, …: q + 1 for a prime q ≡ 3 mod 4, 2(q + 1)
// for a prime q ≡ 1 mod 4). Architectures whose norms do not commute with a
// rotation (Gemma's 1 + w and sandwich norms, mixtures of experts, embedding
// models) are refused by name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/weight_store.h"
#include "util/thread_pool.h"

namespace kettle {

// x ↦ (x ⊙ s) · H / √n for a length-n vector: an orthogonal map applied in
// O(n · (log n + m)) by the factors H = H_m ⊗ H_{2^k} (Sylvester's for 2^k).
class RandomHadamard {
 public:
  RandomHadamard(int64_t n, uint64_t seed);  // fails naming n when no factor is known
  static bool possible(int64_t n);
  int64_t size() const { return n_; }
  void apply(float* x) const;

 private:
  int64_t n_ = 0, p_ = 1;
  int m_ = 1;
  std::vector<int8_t> h_m_;  // m × m
  std::vector<float> signs_;
};

// The rotation of one checkpoint: which tensors change and their new values.
class WeightRotation {
 public:
  WeightRotation(const ModelSpec& spec, const WeightStore& store, uint64_t seed);

  bool changes(const std::string& name) const { return roles_.count(name) != 0; }
  // Tensors the rotated checkpoint holds that the source does not (an untied LM head).
  const std::vector<std::string>& added() const { return added_; }
  bool unties_embeddings() const { return unties_; }
  std::vector<int64_t> shape(const std::string& name) const;
  DType source_dtype(const std::string& name) const;
  // The tensor's rotated values (row-major, its shape), rows or columns across `pool`.
  std::vector<float> values(const std::string& name, ThreadPool& pool) const;

 private:
  enum class Role { kNormToOnes, kReader, kWriter, kEmbedding };
  struct Change {
    Role role;
    std::string source;  // the tensor it is computed from (itself, or the embedding for an untied head)
    std::string gamma;   // a reader's norm weight, folded in
  };

  const WeightStore& store_;
  RandomHadamard rotation_;
  std::map<std::string, Change> roles_;
  std::vector<std::string> added_;
  bool unties_ = false;
};

}  // namespace kettle
