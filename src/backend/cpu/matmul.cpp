// cpu_matmul: argument checks, the split of output features over the pool,
// path choice, and the OpenBLAS path (weights widened panel by panel into
// per-thread scratch, then sgemm with OpenBLAS's own threading off).
#include "backend/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul_kernels.h"
#include "tensor/affine_quant.h"
#include "tensor/host_buffer.h"
#include "util/error.h"

namespace kettle {
namespace {

// Rows per thread are a multiple of this, so every thread's rows fill whole
// register tiles (the tiles are 4 or 8 rows) and start on a cache line.
constexpr int64_t kRowAlign = 16;
// Widened weight panel per sgemm call: big enough for OpenBLAS's blocking,
// small enough to stay in L2 while it is used.
constexpr int64_t kBlasPanelFloats = 256 * 1024;

// Per-thread scratch, grown to the largest size seen and then reused: a
// matmul allocates nothing once the model's shapes have been seen.
enum ScratchSlot { kBiasSlot, kPanelSlot, kDequantSlot, kSlotCount };
float* thread_scratch(ScratchSlot slot, int64_t count) {
  thread_local std::array<HostBuffer<float>, kSlotCount> scratch;
  HostBuffer<float>& buffer = scratch[slot];
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

// sgemm's rounding depends on the panel's width, so panels sit at fixed
// offsets and threads take whole panels: the thread count cannot change a bit.
int64_t blas_panel_rows(int64_t k) {
  int64_t rows = kBlasPanelFloats / std::max<int64_t>(1, k);
  return std::max<int64_t>(kRowAlign, rows / kRowAlign * kRowAlign);
}

void blas_rows(const MatmulTask& t, int64_t row_begin, int64_t row_end) {
  // Concurrent sgemm calls from our pool must not each start OpenBLAS threads.
  static std::once_flag single_threaded;
  std::call_once(single_threaded, [] { openblas_set_num_threads(1); });

  int64_t panel_rows = blas_panel_rows(t.k);
  size_t elem = dtype_size(t.dtype);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += panel_rows) {
    int64_t rows = std::min(panel_rows, row_end - r0);
    const float* panel;
    const void* src = static_cast<const char*>(t.w) + r0 * t.k * static_cast<int64_t>(elem);
    if (t.dtype == DType::kF32) {
      panel = static_cast<const float*>(src);
    } else {
      float* scratch = thread_scratch(kPanelSlot, rows * t.k);
      convert_to_f32(src, t.dtype, scratch, rows * t.k);
      panel = scratch;
    }
    float beta = 0.0f;  // OpenBLAS writes C without reading it when beta is 0
    if (t.bias != nullptr) {
      for (int64_t c = 0; c < t.n; ++c) std::copy_n(t.bias + r0, rows, t.out + c * t.ldo + r0);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t.n), static_cast<int>(rows),
                static_cast<int>(t.k), 1.0f, t.x, static_cast<int>(t.ldx), panel, static_cast<int>(t.k), beta,
                t.out + r0, static_cast<int>(t.ldo));
  }
}

using RowsFn = void (*)(const MatmulTask&, int64_t, int64_t);

RowsFn rows_fn(MatmulPath path) {
  switch (path) {
    case MatmulPath::kGeneric:
      return &matmul_rows_generic;
    case MatmulPath::kAvx2:
      return &matmul_rows_avx2;
    case MatmulPath::kAvx512:
      return &matmul_rows_avx512;
    case MatmulPath::kBlas:
      return &blas_rows;
    case MatmulPath::kAvx512Bf16:
      return &matmul_rows_avx512_bf16;
  }
  return &matmul_rows_generic;
}

// The [m, k] a target computes: w's shape, or for affine codes the unpacked width.
std::pair<int64_t, int64_t> target_shape(const MatmulTarget& t) {
  const int64_t m = t.w->dim(0), cols = t.w->dim(1);
  return {m, t.affine != nullptr ? cols * 32 / t.affine->bits : cols};
}

void check_args(const float* x, int64_t n, int64_t ldx, const MatmulTarget& t, const float* out, int64_t ldo) {
  const Tensor& w = *t.w;
  const Tensor* bias = t.bias;
  if (w.rank() != 2 || w.data == nullptr)
    fail(ErrorCategory::kInternal, "matmul: weight must be a 2-d tensor, got shape {}", shape_string(w.shape));
  if ((t.affine != nullptr) != (w.dtype == DType::kU32))
    fail(ErrorCategory::kInternal, "matmul: a {} weight {}", dtype_name(w.dtype),
         t.affine != nullptr ? "is not packed codes" : "of packed codes has no scales");
  const auto [m, k] = target_shape(t);
  if (n < 0 || ldx < k || ldo < m || (n > 0 && (x == nullptr || out == nullptr)))
    fail(ErrorCategory::kInternal, "matmul: n={} ldx={} ldo={} do not fit weight {} (need ldx >= k, ldo >= m)", n, ldx,
         ldo, shape_string(w.shape));
  if (bias != nullptr && (bias->data == nullptr || bias->numel() != m))
    fail(ErrorCategory::kInternal, "matmul: bias shape {} does not match weight {}", shape_string(bias->shape),
         shape_string(w.shape));
}

}  // namespace

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::kGeneric:
      return "generic";
    case MatmulPath::kAvx2:
      return "avx2";
    case MatmulPath::kAvx512:
      return "avx512";
    case MatmulPath::kBlas:
      return "openblas";
    case MatmulPath::kAvx512Bf16:
      return "avx512-bf16";
  }
  return "?";
}

bool matmul_path_available(MatmulPath path) {
  switch (path) {
    case MatmulPath::kGeneric:
      return true;
    case MatmulPath::kAvx2:
      return cpu_features().avx2_fma_f16c;
    case MatmulPath::kAvx512:
      return cpu_features().avx512;
    case MatmulPath::kBlas:
      return true;
    case MatmulPath::kAvx512Bf16:
      return cpu_features().avx512_bf16;
  }
  return false;
}

// Measured with bench/matmul_bench.cpp on Zen 5 with OpenBLAS 0.3.21 on its
// Haswell kernels: our AVX-512 and AVX2 kernels beat sgemm at every n from 1
// to 128 and every weight dtype (sgemm needs the f32 panels we widen for it,
// and gets no AVX-512); sgemm beats the portable kernels at every n.
MatmulPath choose_matmul_path(int64_t /*n*/, DType dtype) {
  switch (best_cpu_isa()) {
    case CpuIsa::kAvx512:
      // Packed codes (affine weights) take BF16 dot products where the CPU has them.
      return dtype == DType::kU32 && cpu_features().avx512_bf16 ? MatmulPath::kAvx512Bf16 : MatmulPath::kAvx512;
    case CpuIsa::kAvx2:
      return MatmulPath::kAvx2;
    case CpuIsa::kGeneric:
      return MatmulPath::kBlas;
  }
  return MatmulPath::kBlas;
}

void cpu_matmul(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const Tensor& w, const Tensor* bias,
                float* out, int64_t ldo) {
  cpu_matmul_on(choose_matmul_path(n, w.dtype), pool, x, n, ldx, w, bias, out, ldo);
}

void cpu_matmul_on(MatmulPath path, ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const Tensor& w,
                   const Tensor* bias, float* out, int64_t ldo) {
  MatmulTarget target{&w, bias, out, ldo};
  cpu_matmul_many_on(path, pool, x, n, ldx, &target, 1);
}

void cpu_matmul_many(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const MatmulTarget* targets,
                     int count) {
  if (count > 0) cpu_matmul_many_on(choose_matmul_path(n, targets[0].w->dtype), pool, x, n, ldx, targets, count);
}

namespace {

// One weight's share of a grouped matmul: its task and where its rows start in the group.
struct GroupPart {
  MatmulTask task;
  int64_t first_row = 0;
  int64_t rows = 0;
  const AffineScales* affine = nullptr;  // task.w: packed codes
};

// Rows [begin, end) of an affine weight for sgemm: panels of `panel` rows (begin is a multiple of it,
// so panels sit at fixed offsets whatever the thread split) dequantized into f32 scratch,
// each then run as a dense f32 weight by fn.
void affine_rows(RowsFn fn, const GroupPart& part, int64_t panel, int64_t begin, int64_t end) {
  const MatmulTask& t = part.task;
  const AffineScales& a = *part.affine;
  const Tensor codes{t.w, DType::kU32, {part.rows, t.k * a.bits / 32}};
  for (int64_t r0 = begin; r0 < end; r0 += panel) {
    const int64_t rows = std::min(panel, end - r0);
    float* dense = thread_scratch(kDequantSlot, rows * t.k);
    for (int64_t r = 0; r < rows; ++r)
      affine_dequantize(affine_row(codes, a.scales, a.biases, r0 + r), a.bits, a.group_size, 0, t.k, dense + r * t.k);
    MatmulTask sub = t;
    sub.w = dense;
    sub.dtype = DType::kF32;
    sub.affine = nullptr;
    sub.bias = t.bias != nullptr ? t.bias + r0 : nullptr;
    sub.out = t.out + r0;
    fn(sub, 0, rows);
  }
}

const float* f32_bias(const Tensor* bias, std::vector<float>& storage) {
  if (bias == nullptr) return nullptr;
  if (bias->dtype == DType::kF32) return static_cast<const float*>(bias->data);
  storage.resize(static_cast<size_t>(bias->numel()));
  convert_to_f32(bias->data, bias->dtype, storage.data(), bias->numel());
  return storage.data();
}

}  // namespace

void cpu_matmul_many_on(MatmulPath path, ThreadPool& pool, const float* x, int64_t n, int64_t ldx,
                        const MatmulTarget* targets, int count) {
  if (n == 0) return;
  std::vector<GroupPart> parts;
  std::vector<std::vector<float>> biases(static_cast<size_t>(count));
  // Threads take whole granules; blas panels sit at fixed offsets of each weight, so the
  // thread count cannot change a bit of the result.
  const int64_t granule = path == MatmulPath::kBlas ? blas_panel_rows(target_shape(targets[0]).second) : kRowAlign;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    check_args(x, n, ldx, t, t.out, t.ldo);
    const auto [m, k] = target_shape(t);
    const float* bias = f32_bias(t.bias, biases[static_cast<size_t>(i)]);
    if (m == 0) continue;
    if (k == 0) {  // an empty sum: out is the bias (or zero)
      for (int64_t c = 0; c < n; ++c)
        for (int64_t r = 0; r < m; ++r) t.out[c * t.ldo + r] = bias ? bias[r] : 0.0f;
      continue;
    }
    parts.push_back({MatmulTask{x, n, ldx, t.w->data, t.w->dtype, k, bias, t.out, t.ldo, t.affine}, total, m, t.affine});
    total += (m + granule - 1) / granule * granule;  // each weight starts on a granule boundary
  }
  if (parts.empty()) return;
  // The BF16 kernel's split x, made once here for every thread and target that reads it.
  thread_local Bf16SplitX split;
  if (path == MatmulPath::kAvx512Bf16 &&
      std::any_of(parts.begin(), parts.end(), [](const GroupPart& p) { return affine_bf16_kernel_applies(p.affine); })) {
    split_x_bf16(x, n, ldx, parts.front().task.k, split);
    for (GroupPart& p : parts)
      if (affine_bf16_kernel_applies(p.affine)) p.task.split_x = &split;
  }

  RowsFn fn = rows_fn(path);
  const auto run_range = [&](int64_t begin, int64_t end) {
    for (const GroupPart& part : parts) {
      int64_t b = std::max(begin, part.first_row) - part.first_row;
      int64_t e = std::min(end, part.first_row + part.rows) - part.first_row;
      if (b >= e) continue;
      // sgemm reads f32 panels; the kernels read codes themselves.
      if (part.affine != nullptr && path == MatmulPath::kBlas) affine_rows(fn, part, granule, b, e);
      else fn(part.task, b, e);
    }
  };
  int threads = pool.size();
  int64_t granules = (total + granule - 1) / granule;
  int64_t chunk = (granules + threads - 1) / threads * granule;
  if (threads == 1 || chunk >= total) {
    run_range(0, total);
    return;
  }
  pool.run([&](int thread, int) {
    int64_t begin = std::min(total, thread * chunk);
    run_range(begin, std::min(total, begin + chunk));
  });
}

void split_x_bf16(const float* x, int64_t n, int64_t ldx, int64_t k, Bf16SplitX& out) {
  out.k = k;
  out.hi.resize(static_cast<size_t>(n * k));
  out.lo.resize(out.hi.size());
  out.sums.assign(static_cast<size_t>(n * (k / 32)), 0.0f);
  for (int64_t c = 0; c < n; ++c)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[c * ldx + j];
      const uint16_t hi = f32_to_bf16(v), lo = f32_to_bf16(v - bf16_to_f32(hi));
      // Per block of 64 (or a last one of 32): the even elements, then the odd ones.
      const int64_t block = j / 64 * 64, width = std::min<int64_t>(64, k - block), within = j - block;
      const size_t at = static_cast<size_t>(c * k + block + (within % 2) * (width / 2) + within / 2);
      out.hi[at] = hi;
      out.lo[at] = lo;
      out.sums[static_cast<size_t>(c * (k / 32) + j / 32)] += bf16_to_f32(hi) + bf16_to_f32(lo);
    }
}

}  // namespace kettle
