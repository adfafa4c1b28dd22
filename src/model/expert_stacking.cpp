#include "model/expert_stacking.h"

#include <fmt/format.h>

#include <cstring>

#include "model/arch/arch_table.h"
#include "model/weights.h"
#include "util/error.h"

namespace kettle {
namespace {

// Rows of a tensor seen as a matrix of its last dimension.
int64_t matrix_rows(const Tensor& t) { return t.numel() / t.dim(t.rank() - 1); }

}  // namespace

ExpertStacking::ExpertStacking(const ModelSpec& spec, const WeightStore& store) {
  if (spec.n_experts == 0) return;
  const ArchTable& arch = arch_table(spec.model_type, store.folder());
  const std::string prefix = decoder_prefix(store);
  const int64_t n = spec.n_experts, inter = spec.expert_intermediate_size, h = spec.hidden_size;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    if (!spec.layers[i].moe) continue;
    const std::string block = fmt::format("{}layers.{}.{}.", prefix, i, arch.moe_block);
    routers_.push_back(block + "gate.weight");
    const std::string out = block + "switch_mlp.";
    if (store.contains(out + "gate_proj.weight")) continue;  // already stacked
    if (store.contains(block + "experts.gate_up_proj")) {    // transformers 5: [n, 2 inter, h] and [n, h, inter]
      const std::string fused = block + "experts.gate_up_proj", down = block + "experts.down_proj";
      std::vector<StackPart> gate, up;
      for (int64_t e = 0; e < n; ++e) {
        gate.push_back({fused, e * 2 * inter, inter});
        up.push_back({fused, e * 2 * inter + inter, inter});
      }
      add(out + "gate_proj.weight", store, gate, n, inter);
      add(out + "up_proj.weight", store, up, n, inter);
      add(out + "down_proj.weight", store, {{down, 0, n * h}}, n, h);
      continue;
    }
    const std::pair<std::string_view, std::string> projections[] = {
        {arch.expert_gate, "gate_proj"}, {arch.expert_up, "up_proj"}, {arch.expert_down, "down_proj"}};
    for (const auto& [source, target] : projections) {
      std::vector<StackPart> parts;
      const int64_t rows = target == "down_proj" ? h : inter;
      for (int64_t e = 0; e < n; ++e) parts.push_back({fmt::format("{}experts.{}.{}.weight", block, e, source), 0, rows});
      add(out + target + ".weight", store, parts, n, rows);
    }
  }
}

void ExpertStacking::add(const std::string& name, const WeightStore& store, std::vector<StackPart> parts, int64_t n,
                         int64_t out) {
  StackedTensor s;
  for (const StackPart& p : parts) {
    const Tensor t = store.get(p.source);  // an error names a missing or non-float expert
    const int64_t cols = t.dim(t.rank() - 1);
    if (s.shape.empty()) {
      s.shape = {n, out, cols};
      s.dtype = t.dtype;
    }
    if (cols != s.shape[2] || t.dtype != s.dtype || p.row0 + p.rows > matrix_rows(t))
      fail(ErrorCategory::kInvalidData, "{}: '{}' is {} {}, unlike the other experts of '{}' ({} [.., {}])",
           store.folder(), p.source, dtype_name(t.dtype), shape_string(t.shape), name, dtype_name(s.dtype), s.shape[2]);
    consumed_.insert(p.source);
  }
  s.parts = std::move(parts);
  stacked_.emplace(name, std::move(s));
}

Tensor ExpertStacking::gather(const std::string& name, const WeightStore& store, std::vector<uint8_t>& buffer) const {
  const StackedTensor& s = stacked_.at(name);
  const size_t row_bytes = static_cast<size_t>(s.shape[2]) * dtype_size(s.dtype);
  buffer.resize(static_cast<size_t>(s.shape[0] * s.shape[1]) * row_bytes);
  size_t at = 0;
  for (const StackPart& p : s.parts) {
    const Tensor t = store.get(p.source);
    const size_t bytes = static_cast<size_t>(p.rows) * row_bytes;
    std::memcpy(buffer.data() + at, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(p.row0) * row_bytes, bytes);
    at += bytes;
  }
  return Tensor{buffer.data(), s.dtype, s.shape};
}

}  // namespace kettle
