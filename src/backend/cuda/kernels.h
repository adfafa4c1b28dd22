// Launchers of the CUDA backend's kernels, one .cu file per op family. Plain
// C++ types only (weights as raw bf16 bits), so host code needs no CUDA
// headers beyond cudaStream_t. All pointers are device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace kettle::cuda {

using Bf16 = uint16_t;  // storage of __nv_bfloat16

// ---- matmul.cu: decode GEMV (n = 1) -------------------------------------------
struct GemvTarget {
  const Bf16* w = nullptr;      // [rows, k]
  const float* bias = nullptr;  // [rows] or nullptr
  float* out = nullptr;         // [rows]
  int rows = 0;
};
constexpr int kMaxGemvTargets = 4;
bool gemv_supported(int64_t k);  // k a multiple of 8 (16-byte rows)
// targets[i].out (+)= W_i · x (+ b_i) for each target, in one launch; accumulate adds into
// out instead of overwriting it. round_x: x rounded to bf16 as it is read (the rounding
// cuBLAS's GEMMs take), else exact f32.
void gemv(const GemvTarget* targets, int count, const float* x, int k, bool accumulate, bool round_x,
          cudaStream_t stream);
// out[i] = act(gate_i · x + bg) * (up_i · x + bu), one launch.
void gemv_gated(const GemvTarget& gate, const GemvTarget& up, Activation act, const float* x, int k, bool round_x,
                float* out, cudaStream_t stream);
// out[2n, k] (dense): rows [0, n) = bf16(x), rows [n, 2n) = bf16(x - bf16(x)).
void to_bf16_split(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream);
// out[t, i] (stride ldo) (+)= wide[t, i] + wide[n + t, i] (+ bias[i]); wide: [2n, m] dense.
void sum_halves(const float* wide, int64_t n, int64_t m, const float* bias, float* out, int64_t ldo, bool accumulate,
                cudaStream_t stream);
// out[n, k] (dense) = bf16(x[n, k] (stride ldx)): the GEMM's activation operand.
void to_bf16(const float* x, int64_t n, int64_t k, int64_t ldx, Bf16* out, cudaStream_t stream);
// out[t, i] (stride ldo) += bias[i] for t < n, i < m.
void add_bias(float* out, int64_t n, int64_t m, int64_t ldo, const float* bias, cudaStream_t stream);

// ---- affine_matmul.cu: MLX affine 4/8-bit weights (layout: the file's head) --------------
enum AffineScaleType : int { kAffineScaleF32 = 0, kAffineScaleBf16 = 1, kAffineScaleF16 = 2 };
struct AffineWeights {
  const uint8_t* codes = nullptr;  // the tile layout (affine_tile)
  const void* scales = nullptr;    // [rows, k / group_size] of scale_dtype, the block layout (affine_tile_scales)
  const void* biases = nullptr;    // the same shape and type
  int scale_dtype = kAffineScaleF32;
  int bits = 4;
  int group_size = 64;
};
struct AffineTarget {
  AffineWeights w;
  const float* bias = nullptr;  // [rows] or nullptr
  float* out = nullptr;         // [decode rows, ldo]
  int64_t ldo = 0;
  int rows = 0;
};
struct AffineBatch {
  AffineTarget target[kMaxGemvTargets];  // plain: count targets of one bits/group/type; gated: gate, up
  int first_tile[kMaxGemvTargets + 1];   // first 16-row tile of each target; [count] = all
  int count = 0;
  int64_t k = 0;
  int group_size = 0;
  int rows = 0;     // decode rows, at most 8 / split
  int split = 1;    // B columns per row: 1 (x rounded to bf16) or 2 (x as bf16 hi + lo)
  int columns = 0;  // rows * split
  int accumulate = 0;
  int gated = 0;  // out[r, i] = act(gate) * up into gated_out (row stride ldo)
  Activation act{};
  float* gated_out = nullptr;
  int64_t ldo = 0;
};
constexpr int kAffineColumns = 8;
// bits 4 or 8, groups 32/64/128, rows a multiple of 16 and k of 64 and of the group.
bool affine_shape_supported(int bits, int group_size, int64_t rows, int64_t k);
// MLX's row-major packed codes [rows, k · bits / 32] → the tile layout (the same bytes).
void affine_tile(const uint32_t* mlx, int64_t rows, int64_t k, int bits, void* tiles, cudaStream_t stream);
// Row-major scales or biases [rows, groups] (`bytes` each) → the 16-row block layout the
// kernels read (affine_matmul.cu's head); dst apart from src.
void affine_tile_scales(const void* src, int64_t rows, int64_t groups, int bytes, void* dst, cudaStream_t stream);
// out[rows, k] for rows [row0, row0 + rows): part 0 = bf16(s · q + b), part 1 = bf16 of the
// rest, so the two add up to the f32 weight within f32's own rounding.
void affine_dequantize(const AffineWeights& w, int64_t row0, int64_t rows, int64_t k, int part, Bf16* out,
                       cudaStream_t stream);
// out[i, :] = (s · q + b)[ids[i], :] · scale, in f32.
void affine_embed(const int32_t* ids, int64_t n, const AffineWeights& w, int64_t dim, float scale, float* out,
                  cudaStream_t stream);
// x's rows as the decode kernel's operand (rows · split ≤ 8 columns) into workspace
// (affine_x_bytes), then the batch's projections from it.
int64_t affine_x_bytes(int64_t k, int group_size);
void affine_pack_x(const float* x, int rows, int64_t ldx, int64_t k, int split, int group_size, void* workspace,
                   cudaStream_t stream);
void affine_matmul(const AffineBatch& batch, const void* workspace, cudaStream_t stream);

// ---- fp8_matmul.cu: FP8 e4m3 weights (fixed_gemm.h runs their GEMMs) ------------------------
struct Fp8Weights {
  const uint8_t* codes = nullptr;  // [rows, k] row-major
  const float* scales = nullptr;   // element (r, c): scales[(r / block_rows) · scale_ld + c / block_cols]
  int64_t block_rows = 1, block_cols = 1, scale_ld = 1;
};
// Weights the FP8 GEMMs take: a scale per row (row_scales) or per 128 × 128 block.
bool fp8_shape_supported(bool row_scales, int64_t rows, int64_t k);
// Leading dimension of x's block scales for `rows` rows: rows rounded up to 4.
int64_t fp8_x_scale_ld(int64_t rows);
// x [rows, k] (row stride ldx) → codes [padded, k] and scales as GemmScales::x reads them
// (row_scales: [padded]; else [k / 128, fp8_x_scale_ld(padded)]); rows past `rows` zero.
void fp8_quantize_x(const float* x, int64_t rows, int64_t padded, int64_t ldx, int64_t k, bool row_scales,
                    uint8_t* codes, float* scales, cudaStream_t stream);
// out[rows, k] for rows [row0, row0 + rows): part 0 = bf16(code · scale), part 1 = bf16 of
// the rest (affine_dequantize's two parts).
void fp8_dequantize(const Fp8Weights& w, int64_t row0, int64_t rows, int64_t k, int part, Bf16* out,
                    cudaStream_t stream);
// out[i, :] = (code · scale)[ids[i], :] · scale, in f32.
void fp8_embed(const int32_t* ids, int64_t n, const Fp8Weights& w, int64_t dim, float scale, float* out,
               cudaStream_t stream);
// out[t, i] (stride ldo) (+)= src[t, i] for t < n, i < m (src dense).
void add_rows(const float* src, int64_t n, int64_t m, float* out, int64_t ldo, bool accumulate, cudaStream_t stream);

// ---- norm.cu ---------------------------------------------------------------------
void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, float eps, bool add_one,
              float* out, int64_t ldo, cudaStream_t stream);
// The same norm written dense as bf16 [rows, dim]: the GEMM's activation operand in one pass.
void rms_norm_bf16(const float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, float eps, bool add_one,
                   Bf16* out, cudaStream_t stream);
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);
void embed(const int32_t* ids, int64_t n, const Bf16* table, int64_t dim, float scale, float* out,
           cudaStream_t stream);

// ---- activation.cu -----------------------------------------------------------------
void gated_activation(const float* gate, const float* up, int64_t n, int64_t width, int64_t ld, Activation act,
                      float* out, int64_t ldo, cudaStream_t stream);

// ---- rope.cu -----------------------------------------------------------------------
// k and v of token t go to its sequence's logical row positions[t] in kv (KvPages).
void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, int n_heads, int n_kv_heads, int head_dim,
                    const float* q_norm, const float* k_norm, float eps, bool add_one, const int32_t* positions,
                    const float* inv_freq, int rotary_dim, float attention_factor, float* q_out, const KvPages& kv,
                    cudaStream_t stream);

// ---- attention.cu --------------------------------------------------------------------
// Floats of per-chunk partial results attention() needs for these sizes; arrivals: n *
// n_heads counters, zero before the first call (each call leaves them zero).
int64_t attention_partial_floats(int64_t n, int64_t max_kv, const AttentionParams& p);
// Query t reads its keys through its block table (KvPages); any table_stride.
void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions, int64_t max_kv,
               const AttentionParams& p, float* out, int64_t ldo, float* partial, unsigned* arrivals,
               cudaStream_t stream);

// Rotated attention outputs (values stored rotated, tensor/kv_codec.h) back to the channel
// basis: each of n rows' n_heads heads, in Hadamard blocks of `block`.
void unrotate_heads(float* out, int64_t n, int n_heads, int head_dim, int64_t ldo, int block, cudaStream_t stream);

// ---- attention_prefill.cu: many queries of one sequence, tensor cores (head_dim ≤ 256) ------
// Only for kv.table_stride == 0: every query reads the one block table at kv.tables.
bool attention_prefill_supported(const AttentionParams& p, const KvPages& kv);
void attention_prefill(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                       const AttentionParams& p, float* out, int64_t ldo, cudaStream_t stream);

// ---- moe.cu -----------------------------------------------------------------------------
// logits[t, e] = router_e · x_t, x in f32 (no bf16 rounding: routing is a discrete choice).
void router_logits(const float* x, int64_t n, int64_t hidden, const Bf16* router, int n_experts, float* logits,
                   cudaStream_t stream);
constexpr int kMaxRoutedExperts = 512;  // route_top_k keeps 16 logits per lane in registers
// Per token: softmax over logits [n, n_experts], top-k (ties to the lower index), weights
// renormalised when asked. Writes ids [n, top_k] and weights [n, top_k], sorted by expert id.
void route_top_k(const float* logits, int64_t n, int n_experts, int top_k, bool renormalize, int32_t* ids,
                 float* weights, cudaStream_t stream);
// h[t, s, i] = act(gate_e · x_t) * (up_e · x_t) for e = ids[t, s]; expert e's weights at
// gate[e], up[e] (device arrays of device pointers).
void moe_gate_up(const float* x, int64_t n, int64_t hidden, const int32_t* ids, int top_k, const Bf16* const* gate,
                 const Bf16* const* up, int64_t inter, Activation act, float* h, cudaStream_t stream);
// out[t] = Σ_s weights[t, s] · down_e · h[t, s] (expert order), e = ids[t, s].
void moe_down(const float* h, int64_t n, int64_t inter, const int32_t* ids, const float* weights, int top_k,
              const Bf16* const* down, int64_t hidden, float* out, cudaStream_t stream);

// ---- moe_grouped.cu: prompt rows as grouped GEMMs ------------------------------------------
bool moe_grouped_supported(int64_t hidden, int64_t inter);  // both multiples of 8
int64_t moe_grouped_workspace_bytes(int64_t n, int top_k, int n_experts, int64_t hidden);
// The same result as moe_gate_up + moe_down for n rows routed by ids/weights [n, top_k]:
// h [n, top_k, inter] as moe_gate_up writes it (scratch), out [n, hidden]. table: [gate | up | down]
// device pointers, n_experts each. workspace: moe_grouped_workspace_bytes.
void moe_grouped(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int top_k,
                 int n_experts, const Bf16* const* table, int64_t inter, Activation act, float* h, float* out,
                 void* workspace, cudaStream_t stream);

// ---- sampling.cu ---------------------------------------------------------------------------
// arrivals: [rows] counters, zero before the first call (each call leaves its own zero; keep
// them apart from anything else: a later call of more rows reads counters past these);
// partial: argmax_partial_bytes(rows) of scratch.
int64_t argmax_partial_bytes(int64_t rows);
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, unsigned* arrivals, void* partial,
                 cudaStream_t stream);
// SampleRow's rule per row (params: device [rows]): greedy rows through argmax_rows (same
// workspace), the others by one block each, radix-selecting the sorted positions the rule
// needs instead of sorting the row. No host sync.
// Constrained decoding: logits[r][i] = -inf where bit i of row r's mask (masks: [rows,
// ceil(vocab / 32)] words) is 0.
void mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks, cudaStream_t stream);
void sample_rows(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* out,
                 unsigned* arrivals, void* partial, cudaStream_t stream);

}  // namespace kettle::cuda
