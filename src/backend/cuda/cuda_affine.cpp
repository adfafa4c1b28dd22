// Affine (MLX-layout) quantized weights on the CUDA backend: which ones run
// here (4 and 8 bits; others are dequantized by the model runner), their
// resident form (codes in the decode kernel's tile layout: affine_matmul.cu),
// decode rows through the MMA kernel and prompt rows through the GEMMs on
// blocks of dequantized rows.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {
namespace {

int scale_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return cuda::kAffineScaleF32;
    case DType::kBF16:
      return cuda::kAffineScaleBf16;
    case DType::kF16:
      return cuda::kAffineScaleF16;
    default:
      return -1;
  }
}

// Dequantized rows per GEMM: a block of at most 16 M weights (32 MB of bf16).
constexpr int64_t kDenseBlockElements = int64_t{16} << 20;

// At most this many decode rows go through the MMA kernel when batch invariance does not
// ask for it: 8 passes over the codes (64 rows), about what dequantizing costs.
constexpr int64_t kAffineDecodeRows = 64;

}  // namespace

bool CudaBackend::can_run(const Linear& l) const {
  if (l.scheme == WeightScheme::kDense) return true;
  if (l.scheme == WeightScheme::kFp8) return can_run_fp8(l);
  if (l.scheme != WeightScheme::kAffine) return false;
  const DType st = l.affine.scales.dtype;
  return scale_type(st) >= 0 && l.affine.biases.dtype == st &&
         cuda::affine_shape_supported(l.affine.bits, l.affine.group_size, l.out_features(), l.in_features());
}

Linear CudaBackend::resident_linear(const Linear& l) {
  if (l.scheme == WeightScheme::kFp8) return resident_fp8(l);
  if (l.scheme != WeightScheme::kAffine) return Backend::resident_linear(l);
  // The parts in their own types, rearranged on the device into the kernels' layout.
  const int64_t rows = l.out_features(), k = l.in_features(), groups = k / l.affine.group_size;
  Linear r = l;
  r.weight = resident_retiled(l.weight, [&](const void* raw, void* out) {
    cuda::affine_tile(static_cast<const uint32_t*>(raw), rows, k, l.affine.bits, out, stream_);
  });
  for (Tensor* part : {&r.affine.scales, &r.affine.biases})
    *part = resident_retiled(*part, [&](const void* raw, void* out) {
      cuda::affine_tile_scales(raw, rows, groups, static_cast<int>(dtype_size(part->dtype)), out, stream_);
    });
  r.bias = l.bias.empty() ? l.bias : resident(l.bias);
  return r;
}

Tensor CudaBackend::resident_retiled(const Tensor& t, const std::function<void(const void*, void*)>& retile) {
  const ResidentKey key{t.data, t.dtype, t.numel(), fingerprint(t)};
  if (auto it = resident_.find(key); it != resident_.end()) return it->second;
  void* device = nullptr;
  void* raw = nullptr;
  check(cudaMalloc(&device, t.nbytes()), "cudaMalloc (affine weights)");
  check(cudaMalloc(&raw, t.nbytes()), "cudaMalloc (affine weights, as stored)");
  check(cudaMemcpy(raw, t.data, t.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy (affine weights)");
  retile(raw, device);
  check_launch("affine retile");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (affine retile)");
  cudaFree(raw);
  const Tensor resident{device, t.dtype, t.shape};
  resident_.emplace(key, resident);
  return resident;
}

cuda::AffineWeights CudaBackend::affine_weights(const Linear& l) {
  cuda::AffineWeights w;
  w.codes = static_cast<const uint8_t*>(l.weight.data);
  w.scales = l.affine.scales.data;
  w.biases = l.affine.biases.data;
  w.scale_dtype = scale_type(l.affine.scales.dtype);
  w.bits = l.affine.bits;
  w.group_size = l.affine.group_size;
  return w;
}

bool CudaBackend::affine_batchable(const Projection* targets, int count) {
  if (count > cuda::kMaxGemvTargets) return false;
  const Linear& a = *targets[0].linear;
  for (int i = 0; i < count; ++i) {
    const Linear& b = *targets[i].linear;
    if (b.scheme != WeightScheme::kAffine || b.affine.bits != a.affine.bits ||
        b.affine.group_size != a.affine.group_size || b.affine.scales.dtype != a.affine.scales.dtype ||
        b.in_features() != a.in_features())
      return false;
  }
  return true;
}

bool CudaBackend::use_affine_decode(const Projection* targets, int count, int64_t rows) const {
  return affine_batchable(targets, count) && (batch_invariant_ || rows <= kAffineDecodeRows);
}

cuda::AffineBatch CudaBackend::affine_batch(const Linear& first) const {
  cuda::AffineBatch batch;
  batch.k = first.in_features();
  batch.group_size = first.affine.group_size;
  batch.split = affine_split();
  return batch;
}

void CudaBackend::affine_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm,
                                 const Projection* targets, int count, bool accumulate) {
  cuda::AffineBatch batch = affine_batch(*targets[0].linear);
  batch.count = count;
  batch.accumulate = accumulate ? 1 : 0;
  batch.first_tile[0] = 0;
  for (int i = 0; i < count; ++i) {
    const Linear& l = *targets[i].linear;
    batch.target[i] = {affine_weights(l), f32_data(&l.bias, "affine"), targets[i].out, targets[i].ldo,
                       static_cast<int>(l.out_features())};
    batch.first_tile[i + 1] = batch.first_tile[i] + static_cast<int>(l.out_features() / 16);
  }
  affine_rows(x, n, ldx, norm, batch);
}

void CudaBackend::affine_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                               const Projection& up, Activation act, float* out, int64_t ldo) {
  cuda::AffineBatch batch = affine_batch(*gate.linear);
  batch.count = 2;
  batch.gated = 1;
  batch.act = act;
  batch.gated_out = out;
  batch.ldo = ldo;
  int i = 0;
  for (const Projection* p : {&gate, &up}) {
    const Linear& l = *p->linear;
    batch.target[i++] = {affine_weights(l), f32_data(&l.bias, "affine"), nullptr, 0, static_cast<int>(l.out_features())};
  }
  affine_rows(x, n, ldx, norm, batch);
}

// Rows in chunks of 8 / split columns; each chunk packs its x once for all targets.
void CudaBackend::affine_rows(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, cuda::AffineBatch batch) {
  const int64_t k = batch.k;
  if (norm != nullptr) {
    x = normalized(x, n, k, *norm);
    ldx = k;
  }
  float* outs[cuda::kMaxGemvTargets];
  for (int i = 0; i < batch.count; ++i) outs[i] = batch.target[i].out;
  float* gated_out = batch.gated_out;
  void* ws = grow(affine_x_, static_cast<size_t>(cuda::affine_x_bytes(k, batch.group_size)));
  const int64_t chunk = cuda::kAffineColumns / batch.split;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    batch.rows = static_cast<int>(std::min(chunk, n - r0));
    batch.columns = batch.rows * batch.split;
    if (batch.gated) batch.gated_out = gated_out + r0 * batch.ldo;
    else
      for (int i = 0; i < batch.count; ++i) batch.target[i].out = outs[i] + r0 * batch.target[i].ldo;
    cuda::affine_pack_x(x + r0 * ldx, batch.rows, ldx, k, batch.split, batch.group_size, ws, stream_);
    check_launch("affine_pack_x");
    cuda::affine_matmul(batch, ws, stream_);
    check_launch("affine_matmul");
  }
}

// Dequantized as two bf16 parts (hi + lo, two GEMMs into the same sums), so the weights the
// GEMM sees are the f32 ones (s·q + b, code · scale), as the CPU's and the decode kernel's.
void CudaBackend::gemm_linear(const cuda::Bf16* xb, int64_t n, int64_t k, const Linear& w, float* out, int64_t ldo,
                              bool accumulate, Gemm gemm) {
  if (w.scheme == WeightScheme::kDense) return gemm_raw(xb, n, k, w.weight, out, ldo, accumulate, gemm);
  const int64_t m = w.out_features();
  const int64_t block = std::min(m, std::max<int64_t>(16, kDenseBlockElements / k / 16 * 16));
  auto* dense = static_cast<cuda::Bf16*>(grow(affine_dense_, static_cast<size_t>(block * k) * 2));
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t rows = std::min(block, m - r0);
    for (int part = 0; part < 2; ++part) {
      if (w.scheme == WeightScheme::kFp8) cuda::fp8_dequantize(fp8_weights(w), r0, rows, k, part, dense, stream_);
      else cuda::affine_dequantize(affine_weights(w), r0, rows, k, part, dense, stream_);
      check_launch("dequantize");
      gemm_raw(xb, n, k, Tensor{dense, DType::kBF16, {rows, k}}, out + r0, ldo, accumulate || part == 1, gemm);
    }
  }
}

}  // namespace kettle
