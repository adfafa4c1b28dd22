// Backend: the ops a model forward is made of. Activations are f32 buffers
// in the backend's memory (row-major, explicit row strides); weights are
// Tensor views the backend can read (`resident`: the host view itself on the
// CPU, a bf16 copy on the GPU). cpu/ and cuda/ implement it.
//
// Per-step values (token ids, positions) are read from backend memory, never
// passed as host scalars, so a recorded step (`run_step`, a CUDA graph) stays
// valid when only they change; host integers passed to ops are shapes or
// upper bounds fixed for the recording.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/linear.h"
#include "tensor/kv_codec.h"
#include "tensor/tensor.h"

namespace kettle {

enum class Activation { kSilu, kGeluTanh, kGelu };

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;      // multiplies q·k
  float softcap = 0.0f;    // 0: off; else scores become cap * tanh(score / cap)
  int sliding_window = 0;  // 0: full causal; else query i sees key j iff i - j < window
};

struct RopeParams {
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int rotary_dim = 0;               // leading dims of each head that rotate (NeoX halves)
  float attention_factor = 1.0f;    // scales cos and sin (YaRN, LongRoPE)
};

// One expert's projections (dense, or of a scheme the backend runs for experts:
// Backend::can_run_expert).
struct ExpertWeights {
  Linear gate;  // [inter, hidden]
  Linear up;    // [inter, hidden]
  Linear down;  // [hidden, inter]
};

struct MoeParams {
  int top_k = 0;
  bool renormalize = true;  // renormalise the top-k softmax weights to sum to 1
  Activation act = Activation::kSilu;
};

// RMSNorm of each input row, applied by the op that reads the row (the residual stream).
struct InputNorm {
  const Tensor* weight = nullptr;  // [k]
  float eps = 1e-6f;
  bool add_one = false;  // Gemma: x · (1 + w)
};

// Paged KV: one layer's keys and values live in a pool of fixed-size blocks, each
// [pool rows, n_kv_heads * head_dim] (row = block * block_size + offset). A sequence's
// logical row r (its position) is at block table[r / block_size], offset r % block_size.
// Query (or token) t of a call reads its table at tables + t * table_stride; a stride of
// 0 means every token of the call belongs to one sequence (a prompt chunk). Rows are
// stored by the layer's codec (tensor/kv_codec.h): the backend's KV type (Backend::kv_dtype:
// f32 on the CPU, f16 on CUDA), or quantized codes and scales where Backend::runs_kv says.
struct KvPages {
  void* k = nullptr;
  void* v = nullptr;
  int64_t ld = 0;                   // elements of a row (n_kv_heads * head_dim): a plain row's stride
  int block_size = 0;
  const int32_t* tables = nullptr;  // backend memory
  int64_t table_stride = 0;
  KvCodec codec;  // plain rows of kv_dtype unless set

  size_t key_row_bytes() const { return codec.key.row_bytes(ld); }
  size_t value_row_bytes() const { return codec.value.row_bytes(ld); }
};

// One row of device sampling (Backend::sample), in transformers' order: temperature →
// top-k → softmax → top-p → min-p, then the token where the running mass of the kept
// tokens (largest first, ties to the lower id) first exceeds uniform × their total mass.
struct SampleRow {
  float temperature = 0.0f;  // <= 0: greedy (argmax, ties to the lower id)
  int top_k = 0;             // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  float uniform = 0.0f;      // in [0, 1), drawn by the caller's seeded generator
};

// Where one token's q, k and v sit in the packed projection row [q | k | v].
struct QkvLayout {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  const Tensor* q_norm = nullptr;  // [head_dim] per-head RMSNorm before RoPE (Qwen3, Gemma3), or nullptr
  const Tensor* k_norm = nullptr;
  float norm_eps = 1e-6f;
  bool norm_add_one = false;
};

// What one step tells the ops it runs (Backend::run_step).
struct StepContext {
  // Rows [0, decode_rows) of the step's projections are generated tokens (decode), the
  // rest prompt tokens. A backend whose sums could depend on the row count runs each kind
  // through kernels whose sums do not (CUDA: prompt rows always, decode rows when the
  // backend is batch-invariant), so a token's product is the same alone or batched,
  // however prompts are chunked; the CPU's never depend on it.
  int64_t decode_rows = 0;
  // Projections may round x to bf16 (CUDA: the GEMV as it reads x, the GEMMs on bf16
  // rows). A model whose output hinges on discrete choices made from the activations
  // (MoE routing) asks for f32-accurate x instead.
  bool exact_activations = false;
};

// How a backend is made: the device ("cpu", "cuda", "cuda:N" or "auto"), the CPU's
// threads, and the device ordinal (cuda:N); batch_invariant runs a GPU's decode rows
// through batch-invariant kernels too (slower for one stream than its fastest ones; the
// CLI's default unless --no-batch-invariant): off, a decode alone and the same decode
// batched may differ in the last bits of their logits. The CPU is batch-invariant either way.
// FP8 weights: kFp8 runs them on FP8 tensor cores (Hopper: x quantized to FP8 per row and
// 128 columns, as the checkpoints' reference implementations run them; a backend without
// them refuses by name); kBf16 widens them to bf16 at load (the exact product of the
// dequantized weights, at twice the memory); kAuto, for now, is kBf16 (the tensor-core
// path has not yet been measured on a GPU, docs/performance.md).
enum class Fp8Compute { kAuto, kFp8, kBf16 };
Fp8Compute parse_fp8_compute(const std::string& name);  // "auto", "fp8", "bf16"; else an error naming it

struct BackendOptions {
  std::string device = "auto";
  int threads = 1;
  int device_ordinal = 0;
  bool batch_invariant = true;
  Fp8Compute fp8 = Fp8Compute::kAuto;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory -------------------------------------------------------------
  // True when backend memory is host memory (ops may read and write host pointers).
  virtual bool host_memory() const = 0;
  // Uninitialised backend memory, 256-byte aligned; release gives it back.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data, size_t bytes) = 0;
  // Ordered with the ops: to_device may return before the copy lands (the source is
  // read before it returns); to_host returns once the bytes are in host memory.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // backend → backend
  // The view of a weight that ops on this backend read; the backend owns any copy and
  // keeps it until it is destroyed (one copy per host data pointer).
  virtual Tensor resident(const Tensor& weight) = 0;
  // Runs `ops` (a sequence of op calls on fixed buffers) under `context`, which the ops
  // read while they run (and only then: outside a step, every row is a prompt row and
  // activations may be rounded). The same nonzero `key` promises the same calls on the
  // same buffers with only buffer contents changed, so a backend may record them once and
  // replay the recording (CUDA graphs); key 0 runs them as they come. The CPU just calls ops.
  virtual void run_step(const StepContext& context, uint64_t key, const std::function<void()>& ops) = 0;
  // Bytes of backend memory free now; 0 where the backend does not say (host memory).
  virtual size_t free_memory() { return 0; }
  // Bytes of backend memory in all (free or not); 0 where the backend does not say (host memory).
  virtual size_t total_memory() { return 0; }
  // The element type of cached keys and values (KvPages): f32 on the CPU, f16 on CUDA.
  virtual DType kv_dtype() const { return DType::kF32; }
  // Whether qkv_rope_store and attention read and write KV rows stored as `rows`: plain
  // rows of kv_dtype everywhere; quantized ones where a backend says so.
  virtual bool runs_kv(const KvRowCodec& rows) const { return !rows.quantized() && rows.element == kv_dtype(); }
  // Device-to-device copy bandwidth (bytes read + written per second), measured now;
  // 0 where it means nothing (host memory).
  virtual double measure_copy_bandwidth() { return 0.0; }

  // The projections: for each of outs, out (row stride ldo) = x[n, k] (row stride ldx) ·
  // linearᵀ (+ bias), or += with `accumulate` (a block's output added into the residual
  // stream; one output). With `norm`, x (then [n, k] contiguous: ldx == k) is the residual
  // stream, RMS-normalised per row by the op first (a GPU fuses the norm into the
  // projection). Several outputs read x once (q/k/v). A Linear of a scheme or with an
  // adapter the backend cannot run is refused (kettle::Error, kUnsupported).
  virtual void project(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection* outs,
                       int count, bool accumulate = false) = 0;
  // Whether project, project_gated and embed run weights of this scheme (backend/linear.h).
  // The model runner gives a backend only what it runs (it dequantizes the rest).
  virtual bool runs(WeightScheme scheme) const { return scheme == WeightScheme::kDense; }
  // Whether this Linear's scheme and shape run here (a backend may run a scheme for some
  // bit widths or shapes only).
  virtual bool can_run(const Linear& linear) const { return runs(linear.scheme); }
  // Whether moe runs a router or an expert stored as this Linear (a backend may run a
  // scheme in projections but not in its expert kernels; the model runner widens the rest).
  virtual bool can_run_expert(const Linear& linear) const { return can_run(linear); }
  // The Linear as ops on this backend read it: each tensor resident (a backend may keep a
  // scheme's parts in a layout of its own; one copy per host data pointer).
  virtual Linear resident_linear(const Linear& linear);

  // The MLP's first half fused: out[n, inter] (stride ldo) = act(x·gateᵀ + b) * (x·upᵀ + b),
  // x normalised first with `norm` as in project. gate.out and up.out are scratch
  // ([n, inter] each) the op may write.
  virtual void project_gated(const float* x, int64_t n, int64_t ldx, const InputNorm* norm, const Projection& gate,
                             const Projection& up, Activation act, float* out, int64_t ldo) = 0;

  // out[n, dim] = table[ids[i], :] * scale (table: [vocab, dim], dense or of a scheme the backend runs)
  virtual void embed(const int32_t* ids, int64_t n, const Linear& table, float scale, float* out) = 0;

  // Per row of x [rows, dim] (stride ld): out = x / sqrt(mean(x²) + eps) * (add_one ? 1 + w : w).
  // out may alias x.
  virtual void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ld, const Tensor& weight,
                        float eps, bool add_one, float* out, int64_t ldo) = 0;

  // x[i] += y[i] for i < n
  virtual void add(float* x, const float* y, int64_t n) = 0;

  // Per token t of qkv [n, (n_heads + 2 n_kv_heads) * head_dim] (stride ld, packed q | k | v):
  // optional per-head q/k RMSNorm, RoPE of q and k at positions[t], q written to q_out
  // [n, n_heads * head_dim] (contiguous), k and v written to the token's cache row: its
  // sequence's logical row positions[t] in `kv` (see KvPages). positions: backend memory.
  virtual void qkv_rope_store(const float* qkv, int64_t n, int64_t ld, const QkvLayout& layout,
                              const int32_t* positions, const RopeParams& rope, float* q_out,
                              const KvPages& kv) = 0;

  // Causal attention: query t (at positions[t], backend memory) sees its sequence's logical
  // cache rows [0, positions[t]] (the last `sliding_window` of them when set), read through
  // its block table (KvPages). max_kv bounds positions[t] + 1 for every t (the grid is sized
  // by it, so a recorded step may pass a bound above the real lengths). q: [n, n_heads *
  // head_dim] (stride ldq); out: [n, n_heads * head_dim] (stride ldo).
  virtual void attention(const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
                         int64_t max_kv, const AttentionParams& params, float* out, int64_t ldo) = 0;

  // x[i] = cap * tanh(x[i] / cap)
  virtual void softcap(float* x, int64_t n, float cap) = 0;

  // ids[r] = the index of row r's largest logit (ties: the lower index), for greedy decoding
  // where the logits live; logits: [rows, vocab], ids: [rows], both backend memory.
  virtual void argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids) = 0;

  // ids[r] = a token drawn from row r of logits [rows, vocab] as params[r] says (SampleRow);
  // logits, params and ids: backend memory. Temperature 0 rows equal argmax.
  virtual void sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids) = 0;

  // Constrained decoding: logits[r][i] = -inf where bit i of row r's mask is 0. masks:
  // [rows, ceil(vocab / 32)] 32-bit words, bit i of word i / 32 = (i % 32); backend memory.
  virtual void mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks) = 0;

  // Routed mixture of experts: out[n, hidden] = Σ_topk p_e · down_e(act(gate_e x) · up_e x),
  // with router logits = x · routerᵀ and p = softmax over all experts (renormalised over top-k).
  virtual void moe(const float* x, int64_t n, int64_t hidden, const Linear& router,
                   const std::vector<ExpertWeights>& experts, const MoeParams& params, float* out) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
// The backends as a model runner takes them (not owned): one per tensor-parallel rank.
std::vector<Backend*> backend_pointers(const std::vector<std::unique_ptr<Backend>>& backends);

// True when kettle was built with the CUDA backend and a CUDA device is present.
bool cuda_available();
// "cpu", "cuda" or "cuda:N" ("" or "auto": cuda when available, else cpu), batch-invariant.
// Throws kettle::Error (invalid argument) for an unknown name or a device that is not there.
std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads);

}  // namespace kettle
