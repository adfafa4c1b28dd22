// The paged KV cache (KvPages) as kernels see it: a logical row of a query's
// sequence mapped to its pool row through the query's block table, with a
// shift instead of a division when the block size is a power of two. Plain
// keys and values are f16 (CudaBackend::kv_dtype): half the bytes of f32 for
// the attention reads, 11 significant bits, ample range for post-RoPE keys.
// Quantized rows (tensor/kv_codec.h; `quantized`) are bytes of their codec,
// read through kv_rows.cuh.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace kettle::cuda {

struct Pages {
  __half* k = nullptr;  // [pool rows, ld]
  __half* v = nullptr;
  int64_t ld = 0;
  const int32_t* tables = nullptr;  // device memory
  int64_t table_stride = 0;
  int block_size = 1;
  int shift = -1;  // log2(block_size) when a power of two, else -1
  bool quantized = false;  // rows are codes of key_codec / value_codec (k and v as bytes)
  bool pieces = false;     // and both read 16 elements at a time (kv_pieces_fit)
  KvRowCodec key_codec, value_codec;
  int64_t key_row_bytes = 0, value_row_bytes = 0;

  // The block table of query (or token) t.
  __device__ __forceinline__ const int32_t* table(int64_t t) const { return tables + t * table_stride; }
  // Pool row of logical row `row` under `table`.
  __device__ __forceinline__ int64_t row(const int32_t* table, int row) const {
    if (shift >= 0) return (static_cast<int64_t>(__ldg(table + (row >> shift))) << shift) | (row & (block_size - 1));
    return static_cast<int64_t>(__ldg(table + row / block_size)) * block_size + row % block_size;
  }
};

inline Pages pages_of(const KvPages& kv, int head_dim) {
  Pages p;
  p.k = static_cast<__half*>(kv.k);
  p.v = static_cast<__half*>(kv.v);
  p.ld = kv.ld;
  p.tables = kv.tables;
  p.table_stride = kv.table_stride;
  p.block_size = kv.block_size;
  p.quantized = kv.codec.key.quantized() || kv.codec.value.quantized();
  p.key_codec = kv.codec.key;
  p.value_codec = kv.codec.value;
  p.key_row_bytes = static_cast<int64_t>(kv.key_row_bytes());
  p.value_row_bytes = static_cast<int64_t>(kv.value_row_bytes());
  p.pieces = kv_pieces_fit(kv.codec.key, kv.ld, head_dim) && kv_pieces_fit(kv.codec.value, kv.ld, head_dim) &&
             reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v) % 16 == 0;
  if (kv.block_size > 0 && (kv.block_size & (kv.block_size - 1)) == 0) {
    p.shift = 0;
    while ((1 << p.shift) < kv.block_size) ++p.shift;
  }
  return p;
}

}  // namespace kettle::cuda
