// Run-time x86 ISA detection for the CPU backend, and the cap that tests and
// users set to force a slower kernel path (the fast one is the default).
#pragma once

namespace kettle {

struct CpuFeatures {
  bool avx2_fma_f16c = false;
  bool avx512 = false;  // avx512f + bw + vl + dq, what matmul_avx512.cpp is built for
  bool avx512_bf16 = false;  // and vdpbf16ps: matmul_avx512_bf16.cpp
};

const CpuFeatures& cpu_features();

enum class CpuIsa { kGeneric, kAvx2, kAvx512 };

const char* cpu_isa_name(CpuIsa isa);

// The best ISA this CPU has, lowered to the cap (if one is set).
CpuIsa best_cpu_isa();
// The best ISA this CPU has, ignoring the cap.
CpuIsa detected_cpu_isa();
// Kernels dispatch to min(detected, cap). The cap starts at kAvx512 (no cap);
// it is process-wide, so set it before running ops, not while they run.
void set_cpu_isa_cap(CpuIsa cap);
CpuIsa cpu_isa_cap();

}  // namespace kettle
