// WeightStore: every tensor of a model folder by name, across one
// model.safetensors or the shards a model.safetensors.index.json names.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace kettle {

class WeightStore {
 public:
  WeightStore() = default;
  static WeightStore open_folder(const std::string& folder);  // throws naming the missing/corrupt file

  bool contains(const std::string& name) const;
  // The tensor, or an error naming it (and the folder) when it is absent or of a non-float dtype.
  Tensor get(const std::string& name) const;
  // Like get(), and checks the shape: an error names the tensor, the expected and the actual shape.
  Tensor get(const std::string& name, const std::vector<int64_t>& shape) const;
  // The tensor whatever its dtype (packed codes included); an error names it when absent.
  Tensor get_any(const std::string& name) const;
  // A quantized weight's packed codes (U32) of this shape; an error names the tensor otherwise.
  Tensor get_codes(const std::string& name, const std::vector<int64_t>& shape) const;
  // An FP8 weight's e4m3 codes of this shape; an error names the tensor otherwise.
  Tensor get_fp8(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  // Tensors of a dtype kettle cannot use (name → safetensors dtype); get() refuses them.
  const std::map<std::string, std::string>& unusable() const { return bad_dtype_; }

  // Tensors owned here (synthetic weights, converted copies).
  void add_owned(const std::string& name, Tensor tensor, std::shared_ptr<void> storage) const;

  // A store with no files whose required tensors are made on first request (synthetic models),
  // of the dtype asked (bf16 through get(), U32 codes through get_codes(), e4m3 through
  // get_fp8()). kAffine: every projection has scales and biases (an affine-quantized one);
  // kFp8: every layer's projection has an FP8 scale grid (.weight_scale_inv).
  using Fabricator = std::function<std::shared_ptr<void>(const std::string& name, const std::vector<int64_t>& shape,
                                                         DType dtype, Tensor& out)>;
  enum class Fabricated { kFloat, kAffine, kFp8 };
  static WeightStore fabricated(Fabricator fabricator, Fabricated quantized = Fabricated::kFloat);

  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  mutable std::vector<std::shared_ptr<void>> owned_;
  mutable std::map<std::string, std::pair<Tensor, std::string>> index_;  // name -> (tensor, file)
  std::map<std::string, std::string> bad_dtype_;  // name -> dtype kettle cannot use
  Fabricator fabricator_;
  Fabricated fabricates_ = Fabricated::kFloat;
  void fabricate_if_missing(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const;
};

}  // namespace kettle
