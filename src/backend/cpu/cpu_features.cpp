// CPUID queries through the compiler builtin (which also checks that the OS
// saves the wide registers), and the process-wide ISA cap.
#include "backend/cpu/cpu_features.h"

#include <algorithm>
#include <atomic>

namespace kettle {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2_fma_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2_fma_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

// Atomic because a test may lower it while a pool from an earlier test idles.
std::atomic<CpuIsa> g_isa_cap{CpuIsa::kAvx512};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsa detected_cpu_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512) return CpuIsa::kAvx512;
  if (f.avx2_fma_f16c) return CpuIsa::kAvx2;
  return CpuIsa::kGeneric;
}

CpuIsa best_cpu_isa() {
  return std::min(detected_cpu_isa(), g_isa_cap.load(std::memory_order_relaxed));
}

void set_cpu_isa_cap(CpuIsa cap) {
  g_isa_cap.store(cap, std::memory_order_relaxed);
}

CpuIsa cpu_isa_cap() {
  return g_isa_cap.load(std::memory_order_relaxed);
}

}  // namespace kettle
