// Reading AWQ and GPTQ codes, zero points and scales, and writing them as affine rows.
#include "model/zero_point_repack.h"

#include <memory>
#include <vector>

#include "tensor/affine_quant.h"
#include "tensor/host_buffer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kettle {
namespace {

// Where code (input i, output o) and zero point (group g, output o) sit in each layout.
struct ZeroPointLayout {
  const uint32_t* qweight;
  const uint32_t* qzeros;
  int64_t in, out;
  int bits;
  bool awq;

  static uint32_t field(uint32_t word, int index, int bits) { return (word >> (index * bits)) & ((1u << bits) - 1); }
  // AWQ's nibble n of a word holds output 8·w + kAwqOrder[n]; this is its inverse.
  static constexpr int kAwqSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

  uint32_t code(int64_t i, int64_t o) const {
    if (awq) return field(qweight[i * (out / 8) + o / 8], kAwqSlot[o % 8], 4);
    const int per_word = 32 / bits;
    return field(qweight[(i / per_word) * out + o], static_cast<int>(i % per_word), bits);
  }
  uint32_t zero(int64_t g, int64_t o) const {
    if (awq) return field(qzeros[g * (out / 8) + o / 8], kAwqSlot[o % 8], 4);
    const int per_word = 32 / bits;
    return field(qzeros[g * (out / per_word) + o / per_word], static_cast<int>(o % per_word), bits);
  }
};


void check_trivial_groups(const WeightStore& store, const std::string& path, int64_t in, int group) {
  if (!store.contains(path + ".g_idx")) return;
  const Tensor g = store.get_any(path + ".g_idx");
  if (g.dtype != DType::kU32 || g.numel() != in)
    fail(ErrorCategory::kInvalidData, "{}: '{}.g_idx' has shape {}; expected [{}] integers", store.folder(), path,
         shape_string(g.shape), in);
  const auto* idx = static_cast<const uint32_t*>(g.data);
  for (int64_t i = 0; i < in; ++i)
    if (idx[i] != static_cast<uint32_t>(i / group))
      fail(ErrorCategory::kUnsupported, "{}: '{}.g_idx' orders the inputs (act-order); kettle reads contiguous groups",
           store.folder(), path);
}

}  // namespace

Linear repack_zero_point(const WeightStore& store, const QuantConfig& quant, const std::string& path, int64_t out,
                         int64_t in) {
  const QuantParams p = quant.for_module(path);
  const bool awq = quant.method == QuantMethod::kAwq;
  const int bits = p.bits, group = p.group_size, per_word = 32 / bits;
  if (!p.quantized)
    fail(ErrorCategory::kInvalidData, "{}: config.json leaves '{}' unquantized, but the checkpoint holds '{}.qweight'",
         store.folder(), path, path);
  if (in % group != 0 || (awq ? out % 8 : in % per_word) != 0 || out % per_word != 0)
    fail(ErrorCategory::kInvalidData, "{}: '{}' is [{}, {}], which does not split into groups of {} and {}-bit words",
         store.folder(), path, out, in, group, bits);
  const int64_t groups = in / group;
  const std::vector<int64_t> qweight_shape = awq ? std::vector<int64_t>{in, out / 8}
                                                 : std::vector<int64_t>{in / per_word, out};
  const Tensor qweight = store.get_codes(path + ".qweight", qweight_shape);
  const Tensor qzeros = store.get_codes(path + ".qzeros", {groups, out / per_word});
  const Tensor scales = store.get(path + ".scales", {groups, out});
  if (!awq) check_trivial_groups(store, path, in, group);

  const ZeroPointLayout layout{static_cast<const uint32_t*>(qweight.data), static_cast<const uint32_t*>(qzeros.data),
                               in, out, bits, awq};
  const uint32_t zero_offset = !awq && quant.gptq_stored_zero_minus_one ? 1 : 0;
  const int64_t words = in * bits / 32;
  auto codes = std::make_shared<HostBuffer<uint32_t>>(static_cast<size_t>(out * words));
  auto s = std::make_shared<HostBuffer<float>>(static_cast<size_t>(out * groups));
  auto b = std::make_shared<HostBuffer<float>>(static_cast<size_t>(out * groups));
  ThreadPool pool(ThreadPool::default_threads());
  pool.parallel_for(out, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      uint32_t* row = codes->data() + o * words;
      std::fill(row, row + words, 0u);
      for (int64_t i = 0; i < in; ++i) {
        const int64_t bit = i * bits;
        row[bit / 32] |= layout.code(i, o) << (bit % 32);  // bits divide 32: a code never straddles words
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = dtype_value(scales.data, scales.dtype, g * out + o);
        const auto z = static_cast<float>(layout.zero(g, o) + zero_offset);
        s->data()[o * groups + g] = scale;
        b->data()[o * groups + g] = -scale * z;
      }
    }
  });
  Linear l;
  l.scheme = WeightScheme::kAffine;
  l.affine.bits = bits;
  l.affine.group_size = group;
  l.weight = Tensor{codes->data(), DType::kU32, {out, words}};
  l.affine.scales = Tensor{s->data(), DType::kF32, {out, groups}};
  l.affine.biases = Tensor{b->data(), DType::kF32, {out, groups}};
  store.add_owned(path + ".weight (repacked)", l.weight, codes);
  store.add_owned(path + ".scales (repacked)", l.affine.scales, s);
  store.add_owned(path + ".biases (repacked)", l.affine.biases, b);
  return l;
}

}  // namespace kettle
