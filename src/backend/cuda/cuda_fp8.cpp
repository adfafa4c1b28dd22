// FP8 e4m3 weights on the CUDA backend (Hopper: cuBLASLt's FP8 GEMMs with block or
// row scales). Resident as stored: the codes [out, in], and the scales as cuBLASLt
// reads them (a 128 × 128 block grid with rows padded to 4 scales, or one scale per
// row; a tensor's one scale becomes a row's). Projections quantize x to FP8 per row and
// 128 columns (per row for row-scaled weights) and run the FP8 GEMM of a fixed
// configuration per shape, so a row's result is the same in any batch. A step that asks
// for exact activations (MoE routing) gets the weights dequantized to bf16 hi + lo blocks
// instead (gemm_linear), as affine weights are.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "util/log.h"

namespace kettle {
namespace {

constexpr int64_t kFp8Block = 128;

bool row_scaled(const Linear& l) { return l.fp8.scales.dim(1) == 1; }

}  // namespace

bool CudaBackend::fp8_gemms_offered() const {
  if (!fp8_offered_) {
    fp8_offered_ = fp8_gemm(false, Gemm::kPromptFixed).offers(256, 256) && fp8_gemm(true, Gemm::kPromptFixed).offers(256, 256);
    if (!*fp8_offered_)
      log::warn("cuBLASLt offers no FP8 GEMM with block or row scales on {}: FP8 weights are widened to bf16",
                device_name_);
  }
  return *fp8_offered_;
}

bool CudaBackend::can_run_fp8(const Linear& l) const {
  if (!fp8_tensor_cores_ || l.fp8.scales.dtype != DType::kF32 || !fp8_gemms_offered()) return false;
  const bool rows = row_scaled(l);
  if (!rows && (l.fp8.block_rows != kFp8Block || l.fp8.block_cols != kFp8Block)) return false;
  const int64_t m = l.out_features(), k = l.in_features();
  return cuda::fp8_shape_supported(rows, m, k) && fp8_gemm(rows, Gemm::kPromptFixed).offers(m, k) &&
         fp8_gemm(rows, Gemm::kDecodeFixed).offers(m, k);
}

Linear CudaBackend::resident_fp8(const Linear& l) {
  Linear r = l;
  r.weight = resident_retiled(l.weight, [&](const void* raw, void* out) {
    check(cudaMemcpyAsync(out, raw, l.weight.nbytes(), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (fp8)");
  });
  const int64_t m = l.out_features(), grid_rows = l.fp8.scales.dim(0), grid_cols = l.fp8.scales.dim(1);
  const auto* grid = static_cast<const float*>(l.fp8.scales.data);
  std::vector<float> scales;
  if (row_scaled(l)) {  // one per row (a tensor's one scale, repeated)
    scales.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) scales[static_cast<size_t>(i)] = grid[i / l.fp8.block_rows];
    r.fp8 = {Tensor{}, 1, l.in_features()};
    r.fp8.scales = resident_floats(l.fp8.scales, scales, {m, 1});
  } else {  // the block grid, each row of blocks padded to a multiple of 4 scales
    const int64_t ld = (grid_cols + 3) / 4 * 4;
    scales.assign(static_cast<size_t>(grid_rows * ld), 0.0f);
    for (int64_t i = 0; i < grid_rows; ++i)
      std::copy(grid + i * grid_cols, grid + (i + 1) * grid_cols, scales.begin() + i * ld);
    r.fp8.scales = resident_floats(l.fp8.scales, scales, {grid_rows, ld});
  }
  r.bias = l.bias.empty() ? l.bias : resident(l.bias);
  return r;
}

Tensor CudaBackend::resident_floats(const Tensor& source, const std::vector<float>& values,
                                    std::vector<int64_t> shape) {
  const ResidentKey key{source.data, DType::kF32, static_cast<int64_t>(values.size()), fingerprint(source)};
  if (auto it = resident_.find(key); it != resident_.end()) return it->second;
  void* device = nullptr;
  check(cudaMalloc(&device, values.size() * sizeof(float)), "cudaMalloc (fp8 scales)");
  check(cudaMemcpy(device, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy (fp8 scales)");
  const Tensor resident{device, DType::kF32, std::move(shape)};
  resident_.emplace(key, resident);
  return resident;
}

cuda::Fp8Weights CudaBackend::fp8_weights(const Linear& l) {
  return {static_cast<const uint8_t*>(l.weight.data), static_cast<const float*>(l.fp8.scales.data), l.fp8.block_rows,
          l.fp8.block_cols, l.fp8.scales.dim(1)};
}

cuda::FixedGemm& CudaBackend::fp8_gemm(bool row_scales, Gemm gemm) const {
  const int i = (row_scales ? 2 : 0) + (gemm == Gemm::kPromptFixed ? 0 : 1);
  if (!fp8_gemms_[i]) {
    const auto operands = row_scales ? cuda::GemmOperands::kFp8Rows : cuda::GemmOperands::kFp8Blocks;
    // Prompt rows: as the bf16 plan (512 rows, k unsplit); decode rows: 32 rows, split-K allowed.
    fp8_gemms_[i] = gemm == Gemm::kPromptFixed
                        ? std::make_unique<cuda::FixedGemm>(stream_, 512, true, std::vector<int64_t>{}, operands)
                        : std::make_unique<cuda::FixedGemm>(stream_, 32, false, std::vector<int64_t>{}, operands);
  }
  return *fp8_gemms_[i];
}

bool CudaBackend::fp8_product(const Projection& p) const {
  return p.linear->scheme == WeightScheme::kFp8 && !context_.exact_activations;
}

void CudaBackend::fp8_and_others(const float* x, int64_t n, int64_t ldx, const InputNorm* norm,
                                 const Projection* targets, int count, bool accumulate, Gemm gemm) {
  std::vector<Projection> fp8, others;
  for (int i = 0; i < count; ++i) (fp8_product(targets[i]) ? fp8 : others).push_back(targets[i]);
  fp8_project(x, n, ldx, norm, fp8.data(), static_cast<int>(fp8.size()), accumulate, gemm);
  if (!others.empty())
    gemm_project(x, n, ldx, norm, others.data(), static_cast<int>(others.size()), accumulate, gemm);
}

// targets[i].out (+)= x · wᵢᵀ (+ bᵢ) for FP8 weights of one scale layout: x quantized once
// per layout, whole eights of rows straight into the outputs, the rest (padded to eight)
// through a scratch.
void CudaBackend::fp8_project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* targets,
                              int count, bool accumulate, Gemm gemm) {
  const int64_t k = in_of(targets[0]);
  if (norm != nullptr) {
    x = normalized(x, n, k, *norm);
    ldx = k;
  }
  for (bool rows : {false, true}) {
    std::vector<Projection> mine;
    for (int i = 0; i < count; ++i)
      if (row_scaled(*targets[i].linear) == rows) mine.push_back(targets[i]);
    if (mine.empty()) continue;
    cuda::FixedGemm& fixed = fp8_gemm(rows, gemm);
    const int64_t whole = n / 8 * 8;
    for (const auto& [r0, count_rows] : {std::pair{int64_t{0}, whole}, std::pair{whole, n - whole}}) {
      if (count_rows == 0) continue;
      const int64_t padded = (count_rows + 7) / 8 * 8;
      const int64_t scale_floats = rows ? padded : (k / kFp8Block) * cuda::fp8_x_scale_ld(padded);
      auto* codes = static_cast<uint8_t*>(grow(fp8_x_, static_cast<size_t>(padded * k + scale_floats * 4 + 256)));
      auto* x_scales = reinterpret_cast<float*>(codes + (padded * k + 255) / 256 * 256);
      cuda::fp8_quantize_x(x + r0 * ldx, count_rows, padded, ldx, k, rows, codes, x_scales, stream_);
      check_launch("fp8_quantize_x");
      for (const Projection& t : mine) {
        const Linear& w = *t.linear;
        const int64_t m = w.out_features();
        const cuda::GemmScales scales{static_cast<const float*>(w.fp8.scales.data), x_scales};
        float* out = t.out + r0 * t.ldo;
        if (padded == count_rows) {
          fixed.run(codes, padded, k, w.weight.data, m, out, t.ldo, accumulate, scales);
        } else {
          auto* scratch = static_cast<float*>(grow(gemm_out_, static_cast<size_t>(padded * m) * sizeof(float)));
          fixed.run(codes, padded, k, w.weight.data, m, scratch, m, false, scales);
          cuda::add_rows(scratch, count_rows, m, out, t.ldo, accumulate, stream_);
          check_launch("add_rows");
        }
        if (timer_.enabled()) timer_.mark("fp8 gemm " + std::to_string(padded) + "x" + std::to_string(m) + "x" + std::to_string(k));
        if (const float* b = f32_data(bias_of(t), "matmul")) {
          cuda::add_bias(out, count_rows, m, t.ldo, b, stream_);
          check_launch("add_bias");
        }
      }
    }
  }
}

}  // namespace kettle
