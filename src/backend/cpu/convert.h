// Widening of weight elements (bf16, f16, f32) to f32 buffers, dispatched to
// the best ISA the CPU has (F16C for f16 on x86).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kettle {

// dst[i] = src[i] as f32 for i < n; exact for every input (bf16 and f16 widen losslessly).
void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace kettle
