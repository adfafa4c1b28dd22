// Per-weight sensitivity to quantization (KL on calibration text) and the greedy bit
// allocation of `kettle convert --target-bpw`.
#include "model/quant_sensitivity.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "backend/backend.h"
#include "model/model_runner.h"
#include "model/quantize_checkpoint.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kettle {
namespace {

// Every projection slot of the model's weights (a tied embedding and LM head are two
// slots over one tensor).
std::vector<Linear*> linear_slots(ModelWeights& w) {
  std::vector<Linear*> slots = {&w.embed, &w.lm_head};
  for (LayerWeights& l : w.layers)
    for (Linear* p : {&l.q, &l.k, &l.v, &l.qkv, &l.o, &l.gate, &l.up, &l.gate_up, &l.down}) slots.push_back(p);
  return slots;
}

// A weight's affine parts, owned.
struct QuantizedWeight {
  std::vector<uint32_t> codes;
  std::vector<uint8_t> scales, biases;

  Linear as_linear(const Linear& dense, const Tensor& w, int bits, int group_size) const {
    const int64_t rows = w.dim(0), groups = w.dim(1) / group_size;
    Linear l = dense;
    l.scheme = WeightScheme::kAffine;
    l.weight = Tensor{codes.data(), DType::kU32, {rows, w.dim(1) * bits / 32}};
    l.affine = {Tensor{scales.data(), w.dtype, {rows, groups}}, Tensor{biases.data(), w.dtype, {rows, groups}}, bits,
                group_size};
    return l;
  }
};

QuantizedWeight quantize_whole(const Tensor& w, int bits, const SensitivityOptions& o, ThreadPool& pool) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const size_t part_bytes = static_cast<size_t>(rows * (cols / o.group_size)) * dtype_size(w.dtype);
  QuantizedWeight q;
  q.codes.resize(static_cast<size_t>(rows * cols * bits / 32));
  q.scales.resize(part_bytes);
  q.biases.resize(part_bytes);
  quantize_weight_rows(w, 0, rows, bits, o.group_size, o.fit, w.dtype, q.codes.data(), q.scales.data(), q.biases.data(), pool);
  return q;
}

void log_softmax_rows(float* logits, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits + r * width;
    const float top = *std::max_element(row, row + width);
    double sum = 0.0;
    for (int64_t v = 0; v < width; ++v) sum += std::exp(static_cast<double>(row[v] - top));
    const float log_sum = top + static_cast<float>(std::log(sum));
    for (int64_t v = 0; v < width; ++v) row[v] -= log_sum;
  }
}

// The calibration tokens as windows of the model, each's log-probabilities of every
// next token, and the KL of another run's from them.
class Calibration {
 public:
  Calibration(Model& model, const std::vector<int32_t>& tokens, const SensitivityOptions& o)
      : model_(model), device_(o.device), threads_(o.threads > 0 ? o.threads : ThreadPool::default_threads()) {
    if (tokens.size() < 2) fail(ErrorCategory::kInvalidArgument, "calibration: {} tokens; at least 2 are needed", tokens.size());
    int64_t window = o.window;
    if (model.spec.max_position_embeddings > 0) window = std::min(window, model.spec.max_position_embeddings);
    for (size_t at = 0; at + 1 < tokens.size(); at += static_cast<size_t>(window))
      windows_.emplace_back(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                            tokens.begin() + static_cast<std::ptrdiff_t>(std::min(tokens.size(), at + window)));
    if (windows_.back().size() < 2) windows_.pop_back();
    for (const auto& w : windows_) count_ += static_cast<int64_t>(w.size());
    baseline_ = run();
  }

  // Mean KL(float ‖ the model as its weights are now), nats per token.
  double kl_from_baseline() {
    const std::vector<std::vector<float>> now = run();
    const int64_t width = model_.spec.output_width();
    double total = 0.0;
    for (size_t w = 0; w < windows_.size(); ++w)
      for (size_t r = 0; r < windows_[w].size(); ++r) {
        const float* p = baseline_[w].data() + r * width;
        const float* q = now[w].data() + r * width;
        double kl = 0.0;
        for (int64_t v = 0; v < width; ++v) kl += std::exp(static_cast<double>(p[v])) * (p[v] - q[v]);
        total += kl;
      }
    return total / static_cast<double>(count_);
  }

 private:
  std::vector<std::vector<float>> run() {
    const int64_t width = model_.spec.output_width();
    const std::unique_ptr<Backend> backend = make_backend(device_, threads_);
    StandaloneRunner runner = make_standalone_runner(model_, {backend.get()});
    std::vector<std::vector<float>> out;
    for (const auto& w : windows_) {
      std::vector<float> logits(w.size() * static_cast<size_t>(width));
      KvCache kv = runner->new_cache();
      runner->forward(w.data(), static_cast<int64_t>(w.size()), kv, LogitsFor::kAllTokens, logits.data());
      log_softmax_rows(logits.data(), static_cast<int64_t>(w.size()), width);
      out.push_back(std::move(logits));
    }
    return out;
  }

  Model& model_;
  std::string device_;
  int threads_;
  std::vector<std::vector<int32_t>> windows_;
  int64_t count_ = 0;
  std::vector<std::vector<float>> baseline_;
};

DType scale_type(const SensitivityOptions& o, const std::string& name, DType own) {
  const auto it = o.scale_types.find(name);
  return it == o.scale_types.end() ? own : it->second;
}

}  // namespace

std::vector<WeightSensitivity> measure_sensitivity(Model& model, const std::vector<int32_t>& tokens,
                                                   const SensitivityOptions& o,
                                                   const std::function<void(int64_t, int64_t)>& progress) {
  Calibration calibration(model, tokens, o);
  ThreadPool pool(o.threads > 0 ? o.threads : ThreadPool::default_threads());
  const std::vector<Linear*> slots = linear_slots(model.weights);
  std::vector<WeightSensitivity> out;
  for (const std::string& name : model.store->names()) {
    const Tensor w = model.store->get(name);
    if (quantizable(name, w, o.group_size))
      out.push_back({name, w.numel(), scale_type(o, name, w.dtype), std::vector<double>(o.candidate_bits.size(), 0.0)});
  }
  const int64_t total = static_cast<int64_t>(out.size() * o.candidate_bits.size());
  int64_t done = 0;
  for (WeightSensitivity& s : out) {
    const Tensor w = model.store->get(s.name);
    std::vector<Linear*> readers;
    for (Linear* slot : slots)
      if (slot->weight.data == w.data && slot->scheme == WeightScheme::kDense) readers.push_back(slot);
    for (size_t c = 0; c < o.candidate_bits.size(); ++c, ++done) {
      if (progress) progress(done, total);
      if (readers.empty()) continue;
      const int bits = o.candidate_bits[c];
      const QuantizedWeight q = quantize_whole(w, bits, o, pool);
      std::vector<Linear> dense;
      for (Linear* slot : readers) {
        dense.push_back(*slot);
        *slot = q.as_linear(*slot, w, bits, o.group_size);
      }
      s.kl[c] = calibration.kl_from_baseline();
      for (size_t i = 0; i < readers.size(); ++i) *readers[i] = dense[i];
    }
  }
  if (progress) progress(total, total);
  return out;
}

void check_target_bpw(const WeightStore& store, const SensitivityOptions& o, double target_bpw) {
  double parameters = 0.0, bits = 0.0;
  for (const std::string& name : store.names()) {
    const Tensor t = store.get(name);
    parameters += static_cast<double>(t.numel());
    bits += quantizable(name, t, o.group_size)
                ? static_cast<double>(t.numel()) *
                      affine_bits_per_weight(o.candidate_bits[0], o.group_size, scale_type(o, name, t.dtype))
                : static_cast<double>(t.nbytes()) * 8.0;
  }
  if (target_bpw < bits / parameters * (1.0 - 1e-12))
    fail(ErrorCategory::kInvalidArgument, "--target-bpw {}: below the {:.3f} bits per weight the fewest candidate bits "
         "({}) reach", target_bpw, bits / parameters, o.candidate_bits[0]);
}

BitsAllocation allocate_bits(const WeightStore& store, const std::vector<WeightSensitivity>& weights,
                             const SensitivityOptions& o, double target_bpw) {
  check_target_bpw(store, o, target_bpw);
  const std::vector<int>& bits = o.candidate_bits;
  double parameters = 0.0, fixed_bits = 0.0;
  for (const std::string& name : store.names()) {
    const Tensor t = store.get(name);
    parameters += static_cast<double>(t.numel());
    const bool measured = std::any_of(weights.begin(), weights.end(), [&](const auto& w) { return w.name == name; });
    if (!measured) fixed_bits += static_cast<double>(t.nbytes()) * 8.0;
  }
  const auto weight_bits = [&](const WeightSensitivity& w, size_t level) {
    return static_cast<double>(w.parameters) * affine_bits_per_weight(bits[level], o.group_size, w.dtype);
  };
  std::vector<size_t> level(weights.size(), 0);
  double used = fixed_bits;
  for (const WeightSensitivity& w : weights) used += weight_bits(w, 0);
  const double budget = target_bpw * parameters * (1.0 + 1e-12);  // a target read back from a report
  for (;;) {  // the affordable upgrade that saves the most KL per bit added
    size_t best = weights.size(), best_level = 0;
    double best_ratio = 0.0;
    for (size_t i = 0; i < weights.size(); ++i)
      for (size_t to = level[i] + 1; to < bits.size(); ++to) {
        const double cost = weight_bits(weights[i], to) - weight_bits(weights[i], level[i]);
        const double saved = weights[i].kl[level[i]] - weights[i].kl[to];
        if (used + cost > budget || saved <= 0.0 || saved / cost <= best_ratio) continue;
        best = i;
        best_level = to;
        best_ratio = saved / cost;
      }
    if (best == weights.size()) break;
    used += weight_bits(weights[best], best_level) - weight_bits(weights[best], level[best]);
    level[best] = best_level;
  }
  BitsAllocation a;
  for (size_t i = 0; i < weights.size(); ++i) a.bits[weights[i].name] = bits[level[i]];
  a.bits_per_weight = used / parameters;
  return a;
}

}  // namespace kettle
