// Mixture-of-experts weights in mlx-lm's layout for `kettle convert`: every
// MoE layer's experts as three stacked tensors,
// `<block>.switch_mlp.{gate_proj,up_proj,down_proj}.weight` [n_experts, out, in],
// made from one tensor per expert (`<block>.experts.E.<gate>.weight`, as
// transformers 4 saves Qwen3-MoE and Mixtral) or from transformers 5's fused
// `<block>.experts.gate_up_proj` and `<block>.experts.down_proj`. A source
// already in the switch_mlp layout stays as it is. The router (`<block>.gate`)
// keeps its name.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/weight_store.h"

namespace kettle {

// Rows [row0, row0 + rows) of a source tensor seen as a matrix of its last dimension.
struct StackPart {
  std::string source;
  int64_t row0 = 0;
  int64_t rows = 0;
};

struct StackedTensor {
  std::vector<int64_t> shape;    // [n_experts, out, in]
  DType dtype = DType::kF32;     // the sources' (all the same, else refused)
  std::vector<StackPart> parts;  // in order: expert 0's rows, expert 1's, ...
};

class ExpertStacking {
 public:
  // Throws kettle::Error naming the tensor when an expert is missing or the experts'
  // shapes or types differ.
  ExpertStacking(const ModelSpec& spec, const WeightStore& store);

  const std::map<std::string, StackedTensor>& stacked() const { return stacked_; }
  // Source tensors that only feed stacked ones (not written under their own names).
  bool consumed(const std::string& source) const { return consumed_.count(source) != 0; }
  // The routers' tensor names.
  const std::vector<std::string>& routers() const { return routers_; }
  // The stacked tensor's values: its parts copied in order (the caller's buffer, resized).
  Tensor gather(const std::string& name, const WeightStore& store, std::vector<uint8_t>& buffer) const;

 private:
  void add(const std::string& name, const WeightStore& store, std::vector<StackPart> parts, int64_t n, int64_t out);

  std::map<std::string, StackedTensor> stacked_;
  std::set<std::string> consumed_;
  std::vector<std::string> routers_;
};

}  // namespace kettle
