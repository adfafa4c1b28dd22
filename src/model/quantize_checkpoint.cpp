// Quantizing a checkpoint into MLX's affine layout: plan the output tensors and
// shards, stream each tensor through the codec into its shard, then config.json,
// the shard index and the model's other files; rename into place last.
#include "model/quantize_checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <vector>

#include "model/config.h"
#include "model/expert_stacking.h"
#include "model/rotate_weights.h"
#include "model/safetensors_writer.h"
#include "model/weight_store.h"
#include "tensor/affine_quant.h"
#include "util/error.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// One output tensor: a copy of a source tensor, or one of the three parts of a quantized one.
enum class Part { kCopy, kCodes, kScales, kBiases };

struct OutTensor {
  PlannedTensor plan;
  std::string source;  // the source tensor it comes from
  Part part = Part::kCopy;
  int shard = 0;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensors convert writes from: the store's as they are; mixture-of-experts layers'
// experts stacked into mlx-lm's switch_mlp tensors (model/expert_stacking.h); or, where a
// rotation changes them, their rotated values (f32, computed when their turn comes).
class SourceTensors {
 public:
  SourceTensors(const WeightStore& store, const ExpertStacking& stacking, const WeightRotation* rotation)
      : store_(store), stacking_(stacking), rotation_(rotation) {
    for (const std::string& name : store.names())
      if (!stacking.consumed(name)) names_.push_back(name);
    for (const auto& [name, stacked] : stacking.stacked()) names_.push_back(name);
    if (rotation != nullptr) names_.insert(names_.end(), rotation->added().begin(), rotation->added().end());
  }

  const std::vector<std::string>& names() const { return names_; }
  bool rotated(const std::string& name) const { return rotation_ != nullptr && rotation_->changes(name); }
  // Read from the source's pages as they are (let go once written), not made here.
  bool mapped(const std::string& name) const { return !rotated(name) && !stacked(name); }
  // Its shape and type, without data (rotated: F32).
  Tensor meta(const std::string& name) const {
    if (stacked(name)) {
      const StackedTensor& s = stacking_.stacked().at(name);
      return Tensor{nullptr, s.dtype, s.shape};
    }
    if (!rotated(name)) return store_.get(name);
    return Tensor{nullptr, DType::kF32, rotation_->shape(name)};
  }
  // The float type its scales and biases are stored in: the source's own.
  DType stored_type(const std::string& name) const {
    return rotated(name) ? rotation_->source_dtype(name) : meta(name).dtype;
  }
  // The rotated tensors already computed (mixed precision measured the rotated model): read
  // from there instead of rotating again.
  void reuse_rotated(const WeightStore* rotated) { rotated_ = rotated; }
  // Valid until the next get; a rotation runs across `pool`.
  Tensor get(const std::string& name, ThreadPool& pool) {
    if (stacked(name)) return stacking_.gather(name, store_, gathered_);
    if (!rotated(name)) return store_.get(name);
    if (rotated_ != nullptr) return rotated_->get(name);
    values_ = rotation_->values(name, pool);
    return Tensor{values_.data(), DType::kF32, rotation_->shape(name)};
  }

 private:
  bool stacked(const std::string& name) const { return stacking_.stacked().count(name) != 0; }

  const WeightStore& store_;
  const ExpertStacking& stacking_;
  const WeightRotation* rotation_;
  const WeightStore* rotated_ = nullptr;
  std::vector<std::string> names_;
  std::vector<float> values_;
  std::vector<uint8_t> gathered_;
};

// The shape with its last dimension replaced.
std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.back() = last;
  return shape;
}

std::vector<OutTensor> plan_outputs(const SourceTensors& sources, const QuantizeOptions& o) {
  std::vector<OutTensor> out;
  for (const std::string& name : sources.names()) {
    const Tensor t = sources.meta(name);
    if (!o.quantize || !quantizable(name, t, o.group_size)) {
      out.push_back({{name, std::string(dtype_safetensors_name(t.dtype)), t.shape, t.nbytes()}, name, Part::kCopy});
      continue;
    }
    // Stacked experts [n, out, in] quantize as n · out rows; codes, scales and biases keep
    // the leading dimensions (mlx-lm's QuantizedSwitchLinear).
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    const int64_t cols = t.dim(-1), rows = t.numel() / cols, groups = cols / o.group_size, bits = o.bits_for(name);
    const DType stored = sources.stored_type(name);
    const std::string sb_dtype(dtype_safetensors_name(stored));
    const size_t sb_bytes = static_cast<size_t>(rows * groups) * dtype_size(stored);
    out.push_back({{name, "U32", with_last(t.shape, cols * bits / 32), static_cast<size_t>(rows * cols * bits / 8)}, name,
                   Part::kCodes});
    out.push_back({{module + ".scales", sb_dtype, with_last(t.shape, groups), sb_bytes}, name, Part::kScales});
    out.push_back({{module + ".biases", sb_dtype, with_last(t.shape, groups), sb_bytes}, name, Part::kBiases});
  }
  return out;
}

int assign_shards(std::vector<OutTensor>& out, size_t max_bytes) {
  int shard = 0;
  size_t filled = 0;
  for (OutTensor& t : out) {
    if (filled > 0 && filled + t.plan.bytes > max_bytes) {
      ++shard;
      filled = 0;
    }
    t.shard = shard;
    filled += t.plan.bytes;
  }
  return shard + 1;
}

std::string shard_name(int shard, int shards) {
  return shards == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, shards);
}

// f32 values stored as `dtype` at element `at` of out.
void store_as(DType dtype, const float* values, int64_t count, void* out, int64_t at) {
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) static_cast<float*>(out)[at + i] = values[i];
    else static_cast<uint16_t*>(out)[at + i] = dtype == DType::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
  }
}

// Streams the output tensors into their shards; the scales and biases of the weight just
// quantized wait in memory until their turn (they follow its codes).
class ShardWriter {
 public:
  ShardWriter(SourceTensors& sources, const QuantizeOptions& o, std::function<void(size_t)> advanced)
      : sources_(sources),
        options_(o),
        advanced_(std::move(advanced)),
        pool_(o.threads > 0 ? o.threads : ThreadPool::default_threads()) {}

  void write(SafetensorsWriter& file, const OutTensor& t) {
    switch (t.part) {
      case Part::kCopy: return copy(file, sources_.get(t.source, pool_), sources_.mapped(t.source));
      case Part::kCodes:
        return quantize(file, as_matrix(sources_.get(t.source, pool_)), options_.bits_for(t.source),
                        sources_.stored_type(t.source), sources_.mapped(t.source));
      case Part::kScales: return flush(file, scales_);
      case Part::kBiases: return flush(file, biases_);
    }
  }

 private:
  // mapped: t is the source file's pages, let go once written.
  void copy(SafetensorsWriter& file, const Tensor& t, bool mapped) {
    constexpr size_t kChunk = size_t{64} << 20;
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t done = 0; done < t.nbytes(); done += kChunk) {
      const size_t n = std::min(kChunk, t.nbytes() - done);
      file.write(p + done, n);
      if (mapped) release_pages(p + done, n);
      advanced_(n);
    }
  }

  // A stacked [n, out, in] tensor as [n · out, in].
  static Tensor as_matrix(Tensor t) {
    t.shape = {t.numel() / t.dim(-1), t.dim(-1)};
    return t;
  }

  // Rows quantized a batch at a time across the pool, written in order.
  void quantize(SafetensorsWriter& file, const Tensor& t, int bits, DType stored, bool mapped) {
    const int64_t rows = t.dim(0), cols = t.dim(1), groups = cols / options_.group_size;
    const int64_t words = cols * bits / 32;
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(t.dtype);
    const size_t group_bytes = static_cast<size_t>(groups) * dtype_size(stored);
    constexpr int64_t kBatch = 256;
    std::vector<uint32_t> codes(static_cast<size_t>(kBatch * words));
    scales_.assign(static_cast<size_t>(rows) * group_bytes, 0);
    biases_.assign(static_cast<size_t>(rows) * group_bytes, 0);
    for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
      const int64_t n = std::min(kBatch, rows - r0);
      quantize_weight_rows(t, r0, n, bits, options_.group_size, options_.fit, stored, codes.data(),
                           scales_.data() + static_cast<size_t>(r0) * group_bytes,
                           biases_.data() + static_cast<size_t>(r0) * group_bytes, pool_);
      file.write(codes.data(), static_cast<size_t>(n * words) * sizeof(uint32_t));
      if (mapped)
        release_pages(static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r0) * row_bytes,
                      static_cast<size_t>(n) * row_bytes);
      advanced_(static_cast<size_t>(n) * row_bytes);
    }
  }

  static void flush(SafetensorsWriter& file, std::vector<uint8_t>& bytes) {
    file.write(bytes.data(), bytes.size());
    bytes.clear();
    bytes.shrink_to_fit();
  }

  SourceTensors& sources_;
  QuantizeOptions options_;
  std::function<void(size_t)> advanced_;
  std::vector<uint8_t> scales_, biases_;
  ThreadPool pool_;
};

// config.json's "quantization": the default bits and group size, and, as mlx-lm writes mixed
// precision, each module whose bits differ by its path ({"bits", "group_size"}).
json quantization_config(const QuantizeOptions& o, const std::vector<OutTensor>& outputs) {
  json q = {{"group_size", o.group_size}, {"bits", o.bits}, {"mode", "affine"}};
  for (const OutTensor& t : outputs) {
    const int bits = o.bits_for(t.source);
    if (t.part != Part::kCodes || bits == o.bits) continue;
    q[t.source.substr(0, t.source.size() - std::string(".weight").size())] = {{"group_size", o.group_size}, {"bits", bits}};
  }
  return q;
}

// The width most weights take (ties: the fewer bits); `otherwise` when there are none.
int most_common_bits(const std::map<std::string, int>& tensor_bits, int otherwise) {
  std::map<int, int64_t> count;
  for (const auto& [name, bits] : tensor_bits) ++count[bits];
  int best = otherwise;
  int64_t most = 0;
  for (const auto& [bits, n] : count)
    if (n > most) {
      best = bits;
      most = n;
    }
  return best;
}

bool is_weight_file(const fs::path& p) {
  static const std::set<std::string> kWeights = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5",
                                                 ".ckpt"};
  const std::string name = p.filename().string();
  return kWeights.count(p.extension().string()) != 0 || name == "model.safetensors.index.json" ||
         ends_with(name, ".bin.index.json");
}

// Everything of the model folder but its weights and config.json (the tokenizer, templates,
// generation defaults, model card, sentence-transformers modules).
void copy_other_files(const fs::path& src, const fs::path& dst) {
  for (const auto& entry : fs::directory_iterator(src)) {
    const fs::path& p = entry.path();
    const std::string name = p.filename().string();
    if (name == "config.json" || name.empty() || name[0] == '.' || is_weight_file(p)) continue;
    fs::copy(p, dst / name, fs::copy_options::recursive);
  }
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) fail(ErrorCategory::kResourceExhausted, "cannot write {}", path.string());
}

void check_source(const std::string& src, const ModelSpec& spec, const WeightStore& store) {
  if (spec.quant.present())
    fail(ErrorCategory::kInvalidArgument, "{} is already quantized (config.json has 'quantization'); convert reads a "
         "float checkpoint", src);
  if (!store.unusable().empty()) {
    const auto& [name, dtype] = *store.unusable().begin();
    fail(ErrorCategory::kUnsupported, "{}: tensor '{}' has dtype {}; convert reads BF16, F16 and F32 tensors", src, name,
         dtype);
  }
  for (const std::string& name : store.names())
    if (!dtype_is_float(store.get_any(name).dtype))
      fail(ErrorCategory::kInvalidArgument, "{}: tensor '{}' already holds packed codes; convert reads a float "
           "checkpoint", src, name);
}

// The float model convert quantizes, as a Model to run: the source's tensors, those a
// rotation changes (or adds) replaced by their rotated values in f32 — the whole rotated
// model in memory — and their scales' type (the source's) in scale_types.
Model float_source(const std::string& src, const ModelSpec& spec, const WeightStore& store,
                   const WeightRotation* rotation, int threads, std::map<std::string, DType>& scale_types) {
  Model m;
  m.source = src;
  m.spec = spec;
  m.store = std::make_shared<WeightStore>(store);
  if (rotation != nullptr) {
    if (rotation->unties_embeddings()) m.spec.tie_word_embeddings = false;
    ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
    std::vector<std::string> names = store.names();
    names.insert(names.end(), rotation->added().begin(), rotation->added().end());
    for (const std::string& name : names) {
      if (!rotation->changes(name)) continue;
      auto values = std::make_shared<std::vector<float>>(rotation->values(name, pool));
      m.store->add_owned(name, Tensor{values->data(), DType::kF32, rotation->shape(name)}, values);
      scale_types[name] = rotation->source_dtype(name);
    }
  }
  m.weights = bind_weights(m.spec, *m.store);
  return m;
}

void check_options(const QuantizeOptions& o) {
  if (!affine_bits_supported(o.bits))
    fail(ErrorCategory::kInvalidArgument, "--q-bits {}: affine quantization takes 2, 3, 4, 5, 6 or 8 bits", o.bits);
  for (const auto& [name, bits] : o.tensor_bits)
    if (!affine_bits_supported(bits))
      fail(ErrorCategory::kInvalidArgument, "{}: {} bits; affine quantization takes 2, 3, 4, 5, 6 or 8", name, bits);
  if (!affine_group_size_supported(o.group_size))
    fail(ErrorCategory::kInvalidArgument, "--q-group-size {}: affine quantization takes groups of 32, 64 or 128",
         o.group_size);
}

}  // namespace

bool quantizable(const std::string& name, const Tensor& t, int group_size) {
  const bool stacked_experts = t.rank() == 3 && name.find(".switch_mlp.") != std::string::npos;
  return ends_with(name, ".weight") && (t.rank() == 2 || stacked_experts) && t.dim(-1) % group_size == 0;
}

double affine_bits_per_weight(int bits, int group_size, DType scale_type) {
  return bits + 2.0 * 8.0 * static_cast<double>(dtype_size(scale_type)) / group_size;
}

void quantize_weight_rows(const Tensor& w, int64_t r0, int64_t n, int bits, int group_size, AffineFit fit,
                          DType stored, uint32_t* codes, void* scales, void* biases, ThreadPool& pool) {
  const int64_t cols = w.dim(1), groups = cols / group_size, words = cols * bits / 32;
  pool.parallel_for(n, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols)), s(static_cast<size_t>(groups)), b(static_cast<size_t>(groups));
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t c = 0; c < cols; ++c) row[c] = dtype_value(w.data, w.dtype, (r0 + i) * cols + c);
      affine_quantize_row(row.data(), cols, bits, group_size, codes + i * words, s.data(), b.data(), fit, stored);
      store_as(stored, s.data(), groups, scales, i * groups);
      store_as(stored, b.data(), groups, biases, i * groups);
    }
  });
}

QuantizeReport quantize_checkpoint(const std::string& src, const std::string& dst, const QuantizeOptions& options,
                                   const std::function<void(size_t, size_t)>& progress) {
  if (!options.quantize && !options.rotate)
    fail(ErrorCategory::kInvalidArgument, "convert: nothing asked; -q (quantize) or --rotate-weights");
  check_options(options);
  const fs::path out_dir = fs::absolute(dst).lexically_normal();
  if (fs::exists(out_dir)) fail(ErrorCategory::kInvalidArgument, "{} already exists; convert writes a new folder", dst);
  if (!fs::is_directory(out_dir.parent_path()))
    fail(ErrorCategory::kNotFound, "{}: the folder it would go in does not exist", dst);
  const ModelSpec spec = load_model_config(src);
  const WeightStore store = WeightStore::open_folder(src);
  check_source(src, spec, store);
  QuantizeOptions o = options;
  if (o.choose_bits && spec.n_experts > 0)
    fail(ErrorCategory::kUnsupported, "{}: --target-bpw (mixed precision) is not supported yet for mixture-of-experts "
         "models", src);
  const ExpertStacking stacking(spec, store);
  // Routers at 8 bits unless asked otherwise (as mlx-lm's MoE models quantize them):
  // routing compares their logits, and they are a sliver of the model's bytes.
  for (const std::string& router : stacking.routers())
    if (o.bits < 8 && o.tensor_bits.count(router) == 0) o.tensor_bits[router] = 8;
  std::optional<WeightRotation> rotation;
  if (o.rotate) rotation.emplace(spec, store, o.rotation_seed);
  std::optional<Model> source;  // the float model mixed precision measured (kept: its rotated tensors)
  if (o.choose_bits) {
    std::map<std::string, DType> scale_types;
    source = float_source(src, spec, store, rotation ? &*rotation : nullptr, o.threads, scale_types);
    o.tensor_bits = o.choose_bits(*source, scale_types);
    check_options(o);
    o.bits = most_common_bits(o.tensor_bits, o.bits);
  }

  SourceTensors sources(store, stacking, rotation ? &*rotation : nullptr);
  if (source && rotation) sources.reuse_rotated(source->store.get());

  std::vector<OutTensor> outputs = plan_outputs(sources, o);
  const int shards = assign_shards(outputs, o.max_shard_bytes);
  QuantizeReport report;
  report.shards = shards;
  report.bits = o.quantize ? o.bits : 0;
  size_t work = 0;  // bytes of the tensors read as written (rotated: f32)
  for (const std::string& name : store.names()) report.bytes_in += store.get(name).nbytes();
  for (const std::string& name : sources.names()) {
    work += sources.meta(name).nbytes();
    report.parameters += sources.meta(name).numel();
  }

  // Written beside DST, renamed into place once whole; removed on any failure.
  const fs::path temp = out_dir.parent_path() / fmt::format(".{}.partial-{}", out_dir.filename().string(), ::getpid());
  fs::remove_all(temp);
  fs::create_directory(temp);
  try {
    size_t done = 0;
    ShardWriter writer(sources, o, [&](size_t n) {
      done += n;
      if (progress) progress(done, work);
    });
    json weight_map = json::object();
    for (int s = 0; s < shards; ++s) {
      std::vector<PlannedTensor> plans;
      for (const OutTensor& t : outputs)
        if (t.shard == s) plans.push_back(t.plan);
      SafetensorsWriter file((temp / shard_name(s, shards)).string(), plans, {{"format", "mlx"}});
      for (const OutTensor& t : outputs) {
        if (t.shard != s) continue;
        writer.write(file, t);
        weight_map[t.plan.name] = shard_name(s, shards);
        report.bytes_out += t.plan.bytes;
        ++report.tensors;
        if (t.part == Part::kCodes) {
          ++report.quantized;
          ++report.weights_at_bits[o.bits_for(t.source)];
        }
      }
      file.finish();
    }
    json config = json::parse(std::ifstream(fs::path(src) / "config.json"));
    if (o.quantize) {
      const json quantization = quantization_config(o, outputs);
      config["quantization"] = quantization;
      config["quantization_config"] = quantization;
    }
    if (rotation && rotation->unties_embeddings()) config["tie_word_embeddings"] = false;
    write_json(temp / "config.json", config);
    write_json(temp / "model.safetensors.index.json",
               {{"metadata", {{"total_size", report.bytes_out}}}, {"weight_map", weight_map}});
    copy_other_files(src, temp);
    fs::rename(temp, out_dir);
    report.bits_per_weight = static_cast<double>(report.bytes_out) * 8.0 / static_cast<double>(report.parameters);
  } catch (const fs::filesystem_error& e) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    fail(ErrorCategory::kResourceExhausted, "writing {}: {}", dst, e.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
  return report;
}

}  // namespace kettle
