// The CPU backend's ops as free functions over a ThreadPool, one file per
// op family (norm.cpp, qkv.cpp, attention.cpp, activation.cpp, moe.cpp;
// matmul.h for the GEMM family). CpuBackend forwards to these.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/sample_row.h"
#include "util/thread_pool.h"

namespace kettle::cpu {

void embed(ThreadPool& pool, const int32_t* ids, int64_t n, const Linear& table, float scale,
           float* out);

void rms_norm(ThreadPool& pool, const float* x, int64_t rows, int64_t dim, int64_t ld,
              const Tensor& weight, float eps, bool add_one, float* out, int64_t ldo);

void add(ThreadPool& pool, float* x, const float* y, int64_t n);


void gated_activation(ThreadPool& pool, const float* gate, const float* up, int64_t n,
                      int64_t width, int64_t ld, Activation act, float* out, int64_t ldo);
float activate(Activation act, float x);


void qkv_rope_store(ThreadPool& pool, const float* qkv, int64_t n, int64_t ld, const QkvLayout& layout,
                    const int32_t* positions, const RopeParams& rope, float* q_out, const KvPages& kv);

void attention(ThreadPool& pool, const float* q, int64_t n, int64_t ldq, const KvPages& kv,
               const int32_t* positions, const AttentionParams& params, float* out, int64_t ldo);

// The cache row of token t's logical row `row` (KvPages): its block's row in the pool.
inline int64_t page_row(const KvPages& kv, int64_t t, int64_t row) {
  const int32_t* table = kv.tables + t * kv.table_stride;
  return static_cast<int64_t>(table[row / kv.block_size]) * kv.block_size + row % kv.block_size;
}

void softcap(ThreadPool& pool, float* x, int64_t n, float cap);

void moe(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, const Linear& router,
         const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out);

}  // namespace kettle::cpu
