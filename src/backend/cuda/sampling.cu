// Sampling on the device, so only the id crosses to the host. Greedy: the id
// of each row's largest logit (ties to the lower id, as the host argmax).
// SampleRow's rule (cpu/sample_row.cpp, transformers' order): one block per
// row finds the sorted positions the rule needs (the top_k-th token, the
// top-p cut, the token where the running mass passes uniform × kept) by radix
// select over the logits' order keys, with per-bin counts and masses, instead
// of sorting the row. Masses are exact integer sums of exp(c - max) in units
// of 2^-43 (so every level of the select agrees with the one above it);
// ties (equal logits) are ordered by id, as the CPU's sort orders them.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace kettle::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxBlocks = 128;  // per row: enough blocks to stream the logits at bandwidth

struct Best {
  float value;
  int index;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.value, o), __shfl_xor_sync(0xffffffffu, b.index, o)};
    b = better(b, other);
  }
  return b;
}

__device__ Best block_best(Best b) {
  __shared__ Best warps[kArgmaxThreads / kWarp];
  b = warp_best(b);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();
  if (lane == 0) warps[warp] = b;
  __syncthreads();
  b = lane < kArgmaxThreads / kWarp ? warps[lane] : Best{-INFINITY, 0x7fffffff};
  return warp_best(b);
}

// grid (kArgmaxBlocks, rows): each block reduces a slice; the last block of a row to
// finish (arrival counter, left at zero) reduces the blocks' results.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int64_t vocab, Best* partial, unsigned* arrivals, int32_t* out) {
  grid_wait();
  const int64_t row = blockIdx.y;
  const float* x = logits + row * vocab;
  Best b{-INFINITY, 0x7fffffff};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vocab;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    b = better(b, Best{x[i], static_cast<int>(i)});
  b = block_best(b);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partial[row * gridDim.x + blockIdx.x] = b;
    __threadfence();
    last = atomicAdd(arrivals + row, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Best r{-INFINITY, 0x7fffffff};
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    const volatile Best* p = partial + row * gridDim.x + i;
    r = better(r, Best{p->value, p->index});
  }
  r = block_best(r);
  if (threadIdx.x == 0) {
    out[row] = r.index;
    arrivals[row] = 0;
  }
}

// ---- SampleRow's rule -------------------------------------------------------------------
constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / kWarp;
constexpr int kDigitBits = 8;  // radix digits of the 32-bit order key, most significant first
constexpr int kBins = 1 << kDigitBits;
constexpr int kLevels = 32 / kDigitBits;
// Per-warp histograms (dynamic shared memory): [warps][bins] masses, then [warps][bins] counts.
constexpr size_t kWarpHistogramBytes = size_t{kSampleWarps} * kBins * (sizeof(unsigned long long) + sizeof(unsigned));
constexpr double kFixedOne = 8796093022208.0;  // 2^43: a weight ≤ 1 in mass units; 2^20 of them fit 63 bits
constexpr int kPartBits = 21;                  // a weight's three 21-bit parts sum over a warp without overflow

// Larger logit → larger key; -0 and +0 are one value (the CPU compares floats).
__device__ __forceinline__ uint32_t order_key(float c) {
  const uint32_t b = __float_as_uint(c + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// exp(c - top) (in double, as the CPU computes it) in mass units.
__device__ __forceinline__ unsigned long long weight_units(float c, double top) {
  return __double2ull_rn(exp(static_cast<double>(c) - top) * kFixedOne);
}

struct Acc {  // a count and a mass of keys
  unsigned long long count, mass;
};
__device__ __forceinline__ Acc operator+(Acc a, Acc b) {
  return {a.count + b.count, a.mass + b.mass};
}
struct MinOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return min(a, b); }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AccSum {
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const { return a + b; }
};

// Where a select landed: the key at the sought sorted position, that position, the
// mass of the positions up to and including it, and its token id.
struct Selected {
  bool found;
  int position;
  unsigned long long mass;
  int id;
};

struct SampleShared {
  unsigned h_count[kBins];
  unsigned long long h_mass[kBins];
  union {
    cub::BlockReduce<float, kSampleThreads>::TempStorage reduce_f;
    cub::BlockReduce<unsigned long long, kSampleThreads>::TempStorage reduce_u;
    cub::BlockReduce<int, kSampleThreads>::TempStorage reduce_i;
    cub::BlockScan<Acc, kSampleThreads>::TempStorage scan_acc;
    cub::BlockScan<int, kSampleThreads>::TempStorage scan_i;
  } cub;
  // the select's state
  uint32_t prefix;
  unsigned long long count_above, mass_above;  // keys above the current bin
  unsigned bin_count;
  unsigned long long bin_mass;
  int found;
  int id;
  float top;
  unsigned long long total;
};

// One row of logits divided by the temperature, as the CPU divides them.
struct RowView {
  const float* x;
  int vocab;
  float temperature;
  double top;
  __device__ __forceinline__ float logit(int i) const { return x[i] / temperature; }
};

// Counts and masses per digit of the keys that match `prefix` on the bits above the digit.
// Lanes of a warp landing in one bin add once (match + reduce) into the warp's own
// histogram, so concentrated rows (most keys in a few bins) need no atomics at all.
__device__ void histogram(const RowView& row, uint32_t prefix, uint32_t mask, int shift, int bins, SampleShared& sh) {
  extern __shared__ unsigned long long warp_hist[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  unsigned long long* w_mass = warp_hist + warp * kBins;
  unsigned* w_count = reinterpret_cast<unsigned*>(warp_hist + kSampleWarps * kBins) + warp * kBins;
  for (int b = lane; b < bins; b += kWarp) {
    w_count[b] = 0;
    w_mass[b] = 0;
  }
  __syncwarp();
  for (int base = warp * kWarp; base < row.vocab; base += kSampleThreads) {  // uniform per warp
    const int i = base + lane;
    bool in = false;
    unsigned bin = 0;
    unsigned long long w = 0;
    if (i < row.vocab) {
      const float c = row.logit(i);
      const uint32_t key = order_key(c);
      in = (key & mask) == prefix;
      if (in) {
        bin = (key >> shift) & static_cast<uint32_t>(bins - 1);
        w = weight_units(c, row.top);
      }
    }
    const unsigned active = __ballot_sync(0xffffffffu, in);
    if (in) {
      const unsigned peers = __match_any_sync(active, bin);
      const unsigned part_mask = (1u << kPartBits) - 1;
      const unsigned p0 = __reduce_add_sync(peers, static_cast<unsigned>(w) & part_mask);
      const unsigned p1 = __reduce_add_sync(peers, static_cast<unsigned>(w >> kPartBits) & part_mask);
      const unsigned p2 = __reduce_add_sync(peers, static_cast<unsigned>(w >> (2 * kPartBits)));
      if (lane == __ffs(peers) - 1) {  // leaders hold distinct bins
        w_count[bin] += static_cast<unsigned>(__popc(peers));
        w_mass[bin] += (static_cast<unsigned long long>(p2) << (2 * kPartBits)) +
                       (static_cast<unsigned long long>(p1) << kPartBits) + p0;
      }
    }
    __syncwarp();  // the next leader of a bin sees this one's update
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    unsigned count = 0;
    unsigned long long mass = 0;
    for (int w = 0; w < kSampleWarps; ++w) {
      count += reinterpret_cast<const unsigned*>(warp_hist + kSampleWarps * kBins)[w * kBins + b];
      mass += warp_hist[w * kBins + b];
    }
    sh.h_count[b] = count;
    sh.h_mass[b] = mass;
  }
  __syncthreads();
}

// The first sorted position (keys descending, ties by id) whose running count (by_count)
// or running mass reaches `target`. Not found when the whole row does not reach it.
__device__ Selected select(const RowView& row, bool by_count, unsigned long long target, SampleShared& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.count_above = 0;
    sh.mass_above = 0;
    sh.id = -1;
  }
  uint32_t mask = 0;
  int shift = 32;
  for (int level = 0; level < kLevels; ++level) {
    shift -= kDigitBits;
    const int bins = kBins;
    __syncthreads();  // sh.prefix is written
    const uint32_t prefix = sh.prefix;
    const Acc above{sh.count_above, sh.mass_above};
    histogram(row, prefix, mask, shift, bins, sh);
    // Scan the bins from the largest key down: thread t holds scan position t.
    const int pos = static_cast<int>(threadIdx.x);
    const Acc item = pos < bins ? Acc{sh.h_count[bins - 1 - pos], sh.h_mass[bins - 1 - pos]} : Acc{0, 0};
    Acc before;
    cub::BlockScan<Acc, kSampleThreads>(sh.cub.scan_acc).ExclusiveScan(item, before, Acc{0, 0}, AccSum{});
    const auto reached = [&](Acc a) { return a.count > 0 && (by_count ? a.count : a.mass) >= target; };
    if (threadIdx.x == 0) sh.found = 0;
    __syncthreads();
    if (pos < bins) {
      const Acc excl = above + before, incl = excl + item;
      if (reached(incl) && !reached(excl)) {  // exactly one bin, or none at the first level
        const uint32_t bin = static_cast<uint32_t>(bins - 1 - pos);
        sh.prefix = prefix | (bin << shift);
        sh.count_above = excl.count;
        sh.mass_above = excl.mass;
        sh.bin_count = static_cast<unsigned>(item.count);
        sh.bin_mass = item.mass;
        sh.found = 1;
      }
    }
    __syncthreads();
    if (!sh.found) return Selected{false, 0, 0, -1};
    mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
  // All 32 bits fixed: the sought token is the j-th (by id) of the bin's equal keys.
  const unsigned long long w = sh.bin_mass / sh.bin_count;  // equal keys, equal weights
  long long j = 0;
  if (by_count) {
    j = static_cast<long long>(target) - 1 - static_cast<long long>(sh.count_above);
  } else if (sh.mass_above < target && w > 0) {
    j = static_cast<long long>((target - sh.mass_above + w - 1) / w) - 1;
  }
  j = min(max(j, 0ll), static_cast<long long>(sh.bin_count) - 1);
  const uint32_t key = sh.prefix;
  Selected s{true, static_cast<int>(sh.count_above + j), sh.mass_above + static_cast<unsigned long long>(j + 1) * w,
             -1};
  if (j == 0) {
    int best = 0x7fffffff;
    for (int i = threadIdx.x; i < row.vocab; i += blockDim.x)
      if (order_key(row.logit(i)) == key) {
        best = i;
        break;  // this thread's later indices are larger
      }
    best = cub::BlockReduce<int, kSampleThreads>(sh.cub.reduce_i).Reduce(best, MinOp{});
    if (threadIdx.x == 0) sh.id = best;
  } else {
    // Rare (j > 0 needs equal logits): walk the row in id order, counting equal keys.
    int seen = 0;
    for (int base = 0; base < row.vocab; base += blockDim.x) {
      const int i = base + static_cast<int>(threadIdx.x);
      const int flag = i < row.vocab && order_key(row.logit(i)) == key ? 1 : 0;
      int excl = 0, total = 0;
      cub::BlockScan<int, kSampleThreads>(sh.cub.scan_i).ExclusiveSum(flag, excl, total);
      if (flag && seen + excl == j) sh.id = i;
      seen += total;
      if (seen > j) break;  // uniform: total is the block's
      __syncthreads();      // the scan's storage is reused
    }
  }
  __syncthreads();
  s.id = sh.id;
  __syncthreads();
  return s;
}

// grid (rows): one block per sampled row; greedy rows were written by argmax_kernel.
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ logits, int64_t vocab, const SampleRow* __restrict__ params, int32_t* out) {
  grid_wait();
  __shared__ SampleShared sh;
  const SampleRow p = params[blockIdx.x];
  if (!(p.temperature > 0.0f)) return;
  RowView row{logits + blockIdx.x * vocab, static_cast<int>(vocab), p.temperature, 0.0};
  float m = -INFINITY;
  for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) m = fmaxf(m, row.logit(i));
  m = cub::BlockReduce<float, kSampleThreads>(sh.cub.reduce_f).Reduce(m, MaxOp{});
  if (threadIdx.x == 0) sh.top = m;
  __syncthreads();
  row.top = sh.top;

  // top-k: the mass the softmax normalises by is the top_k largest tokens' (else all).
  int keep = row.vocab;
  unsigned long long sum = 0;
  if (p.top_k > 0 && p.top_k < row.vocab) {
    keep = p.top_k;
    sum = select(row, true, static_cast<unsigned long long>(p.top_k), sh).mass;
  } else {
    unsigned long long part = 0;
    for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) part += weight_units(row.logit(i), row.top);
    part = cub::BlockReduce<unsigned long long, kSampleThreads>(sh.cub.reduce_u).Sum(part);
    if (threadIdx.x == 0) sh.total = part;
    __syncthreads();
    sum = sh.total;
  }
  unsigned long long kept = sum;
  // top-p: the smallest prefix whose mass reaches top_p of the sum (at least one token).
  if (p.top_p < 1.0f) {
    const double want = static_cast<double>(p.top_p) * static_cast<double>(sum);
    const Selected s = select(row, false, want > 0.0 ? static_cast<unsigned long long>(ceil(want)) : 0ull, sh);
    if (s.found && s.position + 1 < keep) {
      keep = s.position + 1;
      kept = s.mass;
    }
  }
  // min-p: the tokens whose probability is at least min_p × the top one's (1 / sum).
  if (p.min_p > 0.0f) {
    const double total = static_cast<double>(sum) / kFixedOne, floor_p = p.min_p / total;
    unsigned long long count = 0, mass = 0;
    for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
      const float c = row.logit(i);
      const double w = exp(static_cast<double>(c) - row.top);
      if (w / total >= floor_p) {
        ++count;
        mass += weight_units(c, row.top);
      }
    }
    __syncthreads();
    count = cub::BlockReduce<unsigned long long, kSampleThreads>(sh.cub.reduce_u).Sum(count);
    if (threadIdx.x == 0) sh.total = count;
    __syncthreads();
    count = sh.total;
    __syncthreads();
    mass = cub::BlockReduce<unsigned long long, kSampleThreads>(sh.cub.reduce_u).Sum(mass);
    if (threadIdx.x == 0) sh.total = mass;
    __syncthreads();
    mass = sh.total;
    if (count < static_cast<unsigned long long>(keep)) {
      keep = count > 0 ? static_cast<int>(count) : 1;
      kept = count > 0 ? mass : static_cast<unsigned long long>(kFixedOne);  // the top token alone
    }
  }
  // The token where the running mass first exceeds uniform × kept (the last kept one if
  // rounding leaves it unreached).
  const double goal = static_cast<double>(p.uniform) * static_cast<double>(kept);
  Selected s = select(row, false, static_cast<unsigned long long>(floor(goal)) + 1, sh);
  if (!s.found || s.position >= keep) s = select(row, true, static_cast<unsigned long long>(keep), sh);
  if (threadIdx.x == 0) out[blockIdx.x] = s.id;
}

}  // namespace

int64_t argmax_partial_bytes(int64_t rows) { return rows * kArgmaxBlocks * static_cast<int64_t>(sizeof(Best)); }

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, unsigned* arrivals, void* partial,
                 cudaStream_t stream) {
  launch(argmax_kernel, dim3(kArgmaxBlocks, static_cast<unsigned>(rows)), kArgmaxThreads, 0, stream, logits, vocab,
         static_cast<Best*>(partial), arrivals, out);
}

}  // namespace kettle::cuda

namespace kettle::cuda {

void sample_rows(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* out,
                 unsigned* arrivals, void* partial, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_rows(logits, rows, vocab, out, arrivals, partial, stream);  // every row; sampled rows are overwritten
  cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(kWarpHistogramBytes));
  launch(sample_kernel, dim3(static_cast<unsigned>(rows)), kSampleThreads, kWarpHistogramBytes, stream, logits, vocab,
         params, out);
}

}  // namespace kettle::cuda

namespace kettle::cuda {
namespace {

// One thread per word of 32 tokens: a cleared bit sets its logit to -inf.
__global__ void mask_kernel(float* logits, int64_t vocab, int64_t words, const uint32_t* __restrict__ masks) {
  grid_wait();
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const uint32_t bits = masks[blockIdx.y * words + w];
  if (bits == 0xFFFFFFFFu) return;
  float* row = logits + blockIdx.y * vocab;
  for (int b = 0; b < 32; ++b) {
    const int64_t i = w * 32 + b;
    if (i < vocab && !((bits >> b) & 1u)) row[i] = -INFINITY;
  }
}

}  // namespace

void mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks, cudaStream_t stream) {
  const int64_t words = (vocab + 31) / 32;
  constexpr unsigned kThreads = 256;
  launch(mask_kernel, dim3(static_cast<unsigned>((words + kThreads - 1) / kThreads), static_cast<unsigned>(rows)),
         kThreads, 0, stream, logits, vocab, words, masks);
}

}  // namespace kettle::cuda
