// RoPE (HF rotate_half layout, angles as float32 position × float32 inv_freq,
// as torch computes them) and the fused step after the q/k/v projection:
// per-head q/k RMSNorm, rotation, q to its buffer, k and v into the cache row
// of the token's position through its block table, as f16 or encoded by the layer's
// codec (kv_rows.cuh) (positions and tables are read from device memory, so a recorded
// step can be replayed at the next position).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/paging.cuh"

namespace kettle::cuda {
namespace {

constexpr int kMaxHeadDim = 512;
constexpr int kHeadThreads = 128;

// One head rotated in place by the block's threads: a thread owns the pair (i, i + half);
// dims past 2 half stay as they are.
__device__ __forceinline__ void rotate_half(float* v, int half, float pos, const float* __restrict__ inv_freq,
                                            float attention_factor) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle) * attention_factor, s = sinf(angle) * attention_factor;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

// grid (n, n_heads + 2 n_kv_heads): one block per head of q, k or v of one token.
__global__ void __launch_bounds__(kHeadThreads)
    qkv_rope_store_kernel(const float* __restrict__ qkv, int64_t ld, int n_heads, int n_kv_heads, int head_dim,
                          const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps, bool add_one,
                          const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int half,
                          float attention_factor, float* q_out, Pages kv) {
  grid_wait();
  __shared__ float head[kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t pos = positions[t];
  const bool is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
  const float* src = qkv + t * ld + static_cast<int64_t>(h) * head_dim;  // [q | k | v] heads are contiguous
  const int64_t slot = is_q ? 0 : kv.row(kv.table(t), static_cast<int>(pos)) * kv.ld;
  __half* cached = is_k ? kv.k + slot + static_cast<int64_t>(h - n_heads) * head_dim
                        : kv.v + slot + static_cast<int64_t>(h - n_heads - n_kv_heads) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) head[i] = src[i];
  const float* norm = is_q ? q_norm : is_k ? k_norm : nullptr;
  if (norm != nullptr) {  // uniform per block
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss = fmaf(head[i], head[i], ss);
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
      head[i] = (add_one ? 1.0f + norm[i] : norm[i]) * (head[i] * inv);
  }
  __syncthreads();
  if (is_q || is_k) {
    rotate_half(head, half, static_cast<float>(pos), inv_freq, attention_factor);
    __syncthreads();
  }
  if (is_q) {
    float* dst = q_out + (t * n_heads + h) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = head[i];
  } else if (const KvRowCodec& codec = is_k ? kv.key_codec : kv.value_codec; kv.quantized && codec.quantized()) {
    const int kv_head = is_k ? h - n_heads : h - n_heads - n_kv_heads;
    uint8_t* row = reinterpret_cast<uint8_t*>(is_k ? kv.k : kv.v) +
                   kv.row(kv.table(t), static_cast<int>(pos)) * (is_k ? kv.key_row_bytes : kv.value_row_bytes);
    encode_head(codec, head, kv_head, head_dim, kv.ld, row);
  } else {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) cached[i] = __float2half_rn(head[i]);
  }
}

}  // namespace

void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, int n_heads, int n_kv_heads, int head_dim,
                    const float* q_norm, const float* k_norm, float eps, bool add_one, const int32_t* positions,
                    const float* inv_freq, int rotary_dim, float attention_factor, float* q_out, const KvPages& kv,
                    cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(n_heads + 2 * n_kv_heads));
  launch(qkv_rope_store_kernel, grid, kHeadThreads, 0, stream, qkv, ld, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps,
                                                           add_one, positions, inv_freq, rotary_dim / 2,
                                                           attention_factor, q_out, pages_of(kv, head_dim));
}

}  // namespace kettle::cuda
