// kettle_matmul_bench: cpu_matmul on the llama-3.2-1b projection shapes, per
// kernel path: decode GEMV (n=1) as GB/s of weight bytes against the measured
// memory read bandwidth, prefill GEMM (n=128) as GFLOP/s against FMA peak.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/x86_intrinsics.h"
#include "tensor/host_buffer.h"

namespace kettle {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t m, k;
};

// llama-3.2-1b: hidden 2048, 32 heads / 8 kv heads of 64, intermediate 8192, vocab 128256.
constexpr Shape kShapes[] = {
    {"q/o", 2048, 2048}, {"k/v", 512, 2048}, {"gate/up", 8192, 2048}, {"down", 2048, 8192}, {"lm_head", 128256, 2048},
};

// Seconds per call: the median over calls repeated until min_time has passed,
// after one warm-up call (skipped when a single call already takes that long).
// The median keeps other work on a small machine from skewing the figure.
template <class Fn>
double time_per_call(double min_time, Fn&& fn) {
  auto start = Clock::now();
  fn(0);
  double first = std::chrono::duration<double>(Clock::now() - start).count();
  if (first >= min_time) return first;
  std::vector<double> times;
  double elapsed = 0;
  for (int call = 1; elapsed < min_time || call <= 3; ++call) {
    auto t0 = Clock::now();
    fn(call);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    elapsed += times.back();
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// Memory read ceiling: every thread sums its slice of a buffer far larger than
// the caches, with wide loads and independent accumulators.
__attribute__((target("avx2"))) uint64_t read_slice(const uint64_t* p, int64_t count) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 16 <= count; i += 16) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 3));
}

double read_bandwidth(ThreadPool& pool, const HostBuffer<uint64_t>& buffer, double min_time) {
  int64_t per_thread = static_cast<int64_t>(buffer.size()) / pool.size() / 16 * 16;
  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()));
  double seconds = time_per_call(min_time, [&](int) {
    pool.run([&](int t, int) { sink[t] += read_slice(buffer.data() + t * per_thread, per_thread); });
  });
  return static_cast<double>(per_thread * pool.size() * 8) / seconds / 1e9;
}

// FMA ceiling: independent zmm FMA chains on every thread (2 flops per lane).
__attribute__((target("avx512f"))) float fma_chains(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

double fma_peak(ThreadPool& pool, double min_time) {
  if (!cpu_features().avx512) return 0;
  const int64_t iterations = 1 << 22;
  std::vector<float> sink(static_cast<size_t>(pool.size()));
  double seconds =
      time_per_call(min_time, [&](int) { pool.run([&](int t, int) { sink[t] += fma_chains(iterations); }); });
  return 2.0 * 16 * 12 * static_cast<double>(iterations) * pool.size() / seconds / 1e9;
}

int run(int argc, char** argv) {
  CLI::App app{"kettle_matmul_bench: CPU matmul kernels on llama-3.2-1b shapes"};
  int threads = ThreadPool::default_threads();
  std::string dtype_text = "bf16";
  std::vector<std::string> path_names;
  int64_t prefill_n = 128;
  double min_time = 0.3;
  std::string json_path;
  std::vector<std::string> shape_names;
  app.add_option("--threads", threads, "worker threads (default: all cores)");
  app.add_option("--dtype", dtype_text, "weight dtype: bf16, f16 or f32")->check(CLI::IsMember({"bf16", "f16", "f32"}));
  app.add_option("--paths", path_names, "paths to run (generic avx2 avx512 openblas auto)");
  app.add_option("--shapes", shape_names, "shapes to run (q/o k/v gate/up down lm_head)");
  app.add_option("--prefill-n", prefill_n, "token rows of the prefill GEMM");
  app.add_option("--min-time", min_time, "seconds to time each measurement for");
  app.add_option("--json", json_path, "also write the results to this JSON file");
  CLI11_PARSE(app, argc, argv);
  DType dtype = dtype_text == "bf16" ? DType::kBF16 : dtype_text == "f16" ? DType::kF16 : DType::kF32;

  struct PathChoice {
    std::string name;
    bool is_auto;
    MatmulPath path;
  };
  std::vector<PathChoice> paths;
  if (path_names.empty()) path_names = {"generic", "avx2", "avx512", "openblas", "auto"};
  for (const auto& name : path_names) {
    bool found = false;
    for (MatmulPath p : {MatmulPath::kGeneric, MatmulPath::kAvx2, MatmulPath::kAvx512, MatmulPath::kBlas}) {
      if (name == matmul_path_name(p)) {
        found = true;
        if (matmul_path_available(p))
          paths.push_back({name, false, p});
        else
          fmt::print("skipping {}: this CPU lacks it\n", name);
      }
    }
    if (name == "auto") {
      paths.push_back({name, true, MatmulPath::kGeneric});
      found = true;
    }
    if (!found) {
      fmt::print(stderr, "unknown path '{}'\n", name);
      return 2;
    }
  }

  ThreadPool pool(threads);
  // One arena, far larger than the last-level cache, holding as many copies of
  // each weight as fit; calls cycle through them so decode streams from DRAM.
  const size_t arena_bytes = size_t{640} << 20;
  HostBuffer<uint64_t> arena(arena_bytes / 8);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < arena.size(); ++i) {
    // Random bf16/f16/f32 bit patterns with small exponents (no inf/NaN).
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    arena[i] = (state >> 8) & 0x3f7f3f7f3f7f3f7full & (dtype == DType::kF32 ? 0x3f7fffff3f7fffffull : ~0ull);
  }
  double bandwidth = read_bandwidth(pool, arena, min_time);
  double peak = fma_peak(pool, min_time);
  fmt::print("kettle_matmul_bench: {} threads, {} weights, detected ISA {}\n", threads, dtype_text,
             cpu_isa_name(detected_cpu_isa()));
  fmt::print("ceilings: memory read {:.1f} GB/s, avx512 fma peak {:.1f} GFLOP/s\n\n", bandwidth, peak);
  fmt::print("{:<8} {:>6} {:>5}  {:<8}  {:>12} {:>7}  {:>16} {:>7}\n", "shape", "m", "k", "path", "n=1 GB/s", "of BW",
             fmt::format("n={} GFLOP/s", prefill_n), "of peak");

  nlohmann::json results = nlohmann::json::array();
  int64_t max_n = std::max<int64_t>(1, prefill_n);
  int64_t max_k = 8192;
  HostBuffer<float> x(static_cast<size_t>(max_n * max_k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f - 0.5f;
  HostBuffer<float> out(static_cast<size_t>(max_n * 128256));

  for (const Shape& shape : kShapes) {
    if (!shape_names.empty() && std::find(shape_names.begin(), shape_names.end(), shape.name) == shape_names.end())
      continue;
    size_t bytes = static_cast<size_t>(shape.m * shape.k) * dtype_size(dtype);
    int copies = static_cast<int>(std::max<size_t>(1, arena_bytes / bytes));
    auto weight = [&](int call) {
      const char* base = reinterpret_cast<const char*>(arena.data());
      return Tensor{base + static_cast<size_t>(call % copies) * bytes, dtype, {shape.m, shape.k}};
    };
    for (const PathChoice& p : paths) {
      auto matmul = [&](int64_t n, int call) {
        Tensor w = weight(call);
        if (p.is_auto)
          cpu_matmul(pool, x.data(), n, shape.k, w, nullptr, out.data(), shape.m);
        else
          cpu_matmul_on(p.path, pool, x.data(), n, shape.k, w, nullptr, out.data(), shape.m);
      };
      double decode_s = time_per_call(min_time, [&](int call) { matmul(1, call); });
      double prefill_s = time_per_call(min_time, [&](int call) { matmul(prefill_n, call); });
      double gbps = static_cast<double>(bytes) / decode_s / 1e9;
      double gflops = 2.0 * static_cast<double>(prefill_n * shape.m * shape.k) / prefill_s / 1e9;
      fmt::print("{:<8} {:>6} {:>5}  {:<8}  {:>12.1f} {:>6.0f}%  {:>16.1f} {:>6.0f}%\n", shape.name, shape.m, shape.k,
                 p.name, gbps, 100 * gbps / bandwidth, gflops, peak > 0 ? 100 * gflops / peak : 0.0);
      std::fflush(stdout);
      results.push_back({{"shape", shape.name},
                         {"m", shape.m},
                         {"k", shape.k},
                         {"path", p.name},
                         {"threads", threads},
                         {"dtype", dtype_text},
                         {"decode_gb_s", gbps},
                         {"decode_of_bandwidth", gbps / bandwidth},
                         {"prefill_n", prefill_n},
                         {"prefill_gflop_s", gflops},
                         {"prefill_of_peak", peak > 0 ? gflops / peak : 0.0}});
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc{{"bench", "kettle_matmul_bench"},
                       {"threads", threads},
                       {"read_bandwidth_gb_s", bandwidth},
                       {"fma_peak_gflop_s", peak},
                       {"results", results}};
    std::ofstream(json_path) << doc.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kettle

int main(int argc, char** argv) {
  return kettle::run(argc, argv);
}
