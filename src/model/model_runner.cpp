#include "model/model_runner.h"

#include "model/tensor_parallel_runner.h"
#include "model/transformer.h"

namespace kettle {

std::unique_ptr<ModelRunner> make_model_runner(const Model& model, const std::vector<Backend*>& backends,
                                               KvPool::Options kv) {
  if (backends.size() == 1) return std::make_unique<Transformer>(model, *backends[0], kv);
  return std::make_unique<TensorParallelRunner>(model, backends, kv);
}

}  // namespace kettle
