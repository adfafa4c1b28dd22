// convert_to_f32: picks the kernel for the CPU's best ISA (under the cap set
// by set_cpu_isa_cap); the kernels live in the per-ISA matmul files.
#include "backend/cpu/convert.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul_kernels.h"
#include "util/error.h"

namespace kettle {

void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n) {
  if (n <= 0) return;
  if (!dtype_is_float(dtype)) fail(ErrorCategory::kInternal, "convert_to_f32: {} is not a float type", dtype_name(dtype));
  switch (best_cpu_isa()) {
    case CpuIsa::kAvx512:
      return convert_to_f32_avx512(src, dtype, dst, n);
    case CpuIsa::kAvx2:
      return convert_to_f32_avx2(src, dtype, dst, n);
    case CpuIsa::kGeneric:
      return convert_to_f32_generic(src, dtype, dst, n);
  }
}

}  // namespace kettle
