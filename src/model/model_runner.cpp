#include "model/model_runner.h"

#include <algorithm>
#include <utility>

#include "model/tensor_parallel.h"
#include "model/tensor_parallel_runner.h"
#include "model/decoder_runner.h"
#include "util/error.h"

namespace kettle {

std::unique_ptr<ModelRunner> make_model_runner(const Model& model, const std::vector<Backend*>& backends, KvPool& pool) {
  if (backends.size() == 1) return std::make_unique<DecoderRunner>(model, *backends[0], pool);
  if (model.spec.hidden_output)
    fail(ErrorCategory::kUnsupported, "{} is an embedding model: it runs on one device (no tensor parallelism)",
         model.source);
  return std::make_unique<TensorParallelRunner>(model, backends, pool);
}

int64_t logits_rows(const std::vector<BatchEntry>& entries) {
  int64_t rows = 0;
  for (const BatchEntry& e : entries) rows += e.logits;
  return rows;
}

void reserve_caches(const std::vector<BatchEntry>& entries) {
  for (const BatchEntry& e : entries) e.kv->reserve(e.kv->length() + e.ahead + e.n);
}

void advance_caches(const std::vector<BatchEntry>& entries) {
  std::vector<std::pair<KvCache*, int64_t>> ends;  // a verify's rows name one cache several times
  for (const BatchEntry& e : entries) {
    const int64_t end = e.kv->length() + e.ahead + e.n;
    auto it = std::find_if(ends.begin(), ends.end(), [&](const auto& x) { return x.first == e.kv; });
    if (it == ends.end())
      ends.emplace_back(e.kv, end);
    else
      it->second = std::max(it->second, end);
  }
  for (const auto& [kv, end] : ends) kv->set_length(end);
}

KvLayout kv_layout(const ModelSpec& spec, DType element, int ranks, const KvQuant& quant) {
  check_splittable(spec, ranks);
  KvLayout layout;
  layout.kv_heads = spec.n_kv_heads / ranks;
  layout.head_dim = spec.head_dim;
  for (const LayerSpec& l : spec.layers) {
    KvLayer layer = l.sliding_window > 0 ? KvLayer{KvLayer::Kind::kWindow, l.sliding_window, {}} : KvLayer{};
    layer.codec = quant.codec_for(static_cast<int64_t>(layout.layers.size()), layer.kind, spec.head_dim, element);
    layout.layers.push_back(layer);
  }
  for (const KvQuant::LayerBits& l : quant.layers)
    if (l.layer < 0 || l.layer >= static_cast<int64_t>(spec.layers.size()))
      fail(ErrorCategory::kInvalidArgument, "--kv-quant config: layer_idx {} is not a layer of this model (0 to {})",
           l.layer, spec.layers.size() - 1);
  return layout;
}

std::unique_ptr<KvPool> make_kv_pool(const ModelSpec& spec, const std::vector<Backend*>& backends,
                                     KvPool::Options options, const KvQuant& quant) {
  const KvLayout layout = kv_layout(spec, backends.at(0)->kv_dtype(), static_cast<int>(backends.size()), quant);
  return std::make_unique<KvPool>(layout, backends, options);
}

StandaloneRunner make_standalone_runner(const Model& model, const std::vector<Backend*>& backends,
                                        KvPool::Options options, const KvQuant& quant) {
  StandaloneRunner r;
  r.pool = make_kv_pool(model.spec, backends, options, quant);
  r.runner = make_model_runner(model, backends, *r.pool);
  return r;
}

}  // namespace kettle
