// Causal softmax attention over a paged KV cache (query t sees its sequence's
// logical rows [0, positions[t]], read through its block table), with
// grouped-query heads, Gemma-2 score softcapping and sliding windows
// (Hugging Face semantics: query i sees key j iff 0 <= i - j < window).
// Softmax in f32 with the running max subtracted, as torch's softmax does.
// Quantized rows (tensor/kv_codec.h) are decoded as they are read — a prompt
// chunk's rows once for the whole chunk, a decode's row by row; rotated values
// are summed as stored and the output un-rotated once per head.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "backend/cpu/ops.h"

namespace kettle::cpu {
namespace {

// Eight floats: one AVX register, two SSE ones (GCC splits the vector where the target is
// narrower); each lane is multiplied, then added, as the scalar loop rounds.
typedef float Lanes8 __attribute__((vector_size(32)));

// Eight independent lanes (lane j sums the products of elements 8i + j), combined in a
// fixed order: the same bits in AVX registers, SSE ones or none.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, int n) {
  Lanes8 lanes = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes8 x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    const Lanes8 product = x * y;
    lanes = lanes + product;
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += a · x, element by element (a multiply then an add, eight at a time or one).
[[gnu::always_inline]] inline void axpy(float* y, float a, const float* x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes8 xi, yi;
    std::memcpy(&xi, x + i, sizeof xi);
    std::memcpy(&yi, y + i, sizeof yi);
    const Lanes8 product = a * xi;
    yi = yi + product;
    std::memcpy(y + i, &yi, sizeof yi);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

// fn(j, row) for keys j = 0 .. count - 1 of query t, key j at logical row first + j: the
// block table read (page_row) once per block, not once per key.
template <typename Fn>
[[gnu::always_inline]] inline void for_each_kv_row(const KvPages& kv, int64_t t, int64_t first, int64_t count, Fn&& fn) {
  for (int64_t j = 0; j < count;) {
    const int64_t base = page_row(kv, t, first + j);
    const int64_t run = std::min<int64_t>(kv.block_size - (first + j) % kv.block_size, count - j);
    for (int64_t r = 0; r < run; ++r, ++j) fn(j, base + r);
  }
}

// Keys (or values) of KV head h in pool row `row` as f32: in place for plain rows, else
// decoded into buf (head_dim floats).
inline const float* head_row(const void* base, const KvRowCodec& codec, int64_t ld, int64_t row, int h, int hd,
                             float* buf) {
  if (!codec.quantized()) return static_cast<const float*>(base) + row * ld + static_cast<int64_t>(h) * hd;
  kv_decode_span(codec, static_cast<const uint8_t*>(base) + static_cast<size_t>(row) * codec.row_bytes(ld), ld,
                 static_cast<int64_t>(h) * hd, hd, buf);
  return buf;
}

void attend(ThreadPool& pool, const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
            const AttentionParams& p, float* out, int64_t ldo);

// A prompt chunk's quantized rows, decoded once for all its queries: the rows the chunk's
// queries see, as plain f32 pages of their own (an identity block table).
struct DecodedChunk {
  std::vector<float> k, v;
  std::vector<int32_t> table;
  KvPages pages;
};
void decode_chunk(ThreadPool& pool, const KvPages& kv, const int32_t* positions, int64_t n, int64_t window,
                  DecodedChunk& d) {
  int64_t rows = 0, first = INT64_MAX;
  for (int64_t t = 0; t < n; ++t) {
    rows = std::max<int64_t>(rows, positions[t] + 1);
    first = std::min<int64_t>(first, window > 0 ? std::max<int64_t>(0, positions[t] - window + 1) : 0);
  }
  const int64_t blocks = (rows + kv.block_size - 1) / kv.block_size;
  d.k.assign(static_cast<size_t>(blocks * kv.block_size * kv.ld), 0.0f);
  d.v.assign(d.k.size(), 0.0f);
  d.table.resize(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) d.table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  pool.parallel_for(rows - first, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = first + begin; r < first + end; ++r) {
      const int64_t slot = page_row(kv, 0, r);
      float* k = d.k.data() + r * kv.ld;
      float* v = d.v.data() + r * kv.ld;
      for (const auto& [codec, base, dst] : {std::tuple{&kv.codec.key, kv.k, k}, std::tuple{&kv.codec.value, kv.v, v}}) {
        if (codec->quantized())
          kv_decode_span(*codec, static_cast<const uint8_t*>(base) + static_cast<size_t>(slot) * codec->row_bytes(kv.ld),
                         kv.ld, 0, kv.ld, dst);
        else
          std::copy_n(static_cast<const float*>(base) + slot * kv.ld, kv.ld, dst);
      }
    }
  });
  d.pages = KvPages{d.k.data(), d.v.data(), kv.ld, kv.block_size, d.table.data(), 0, {}};
}

}  // namespace

void attention(ThreadPool& pool, const float* q, int64_t n, int64_t ldq, const KvPages& kv,
               const int32_t* positions, const AttentionParams& p, float* out, int64_t ldo) {
  if ((kv.codec.key.quantized() || kv.codec.value.quantized()) && kv.table_stride == 0 && n > 1) {
    DecodedChunk chunk;
    decode_chunk(pool, kv, positions, n, p.sliding_window, chunk);
    attend(pool, q, n, ldq, chunk.pages, positions, p, out, ldo);
  } else {
    attend(pool, q, n, ldq, kv, positions, p, out, ldo);
  }
  if (const int block = kv.codec.value.rotation; block > 0)
    pool.parallel_for(n * p.n_heads, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        kv_unrotate(out + i / p.n_heads * ldo + i % p.n_heads * p.head_dim, p.head_dim, block);
    });
}

namespace {

// One work item is a query and some of the query heads that share a KV head (all of them
// unless that leaves threads idle): they read each key and value row once, and each head's
// sums run in the same order as it would alone.
struct AttendItems {
  const float* q;
  int64_t ldq;
  const KvPages& kv;
  const int32_t* positions;
  const AttentionParams& p;
  float* out;
  int64_t ldo;
  int heads_per_item, items_per_kv;
};

// Items [begin, end); on x86 also built for AVX (chosen at load time): the same operations
// on eight lanes a register, so the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx", "default")))
#endif
void attend_items(const AttendItems& w, int64_t begin, int64_t end) {
  const AttentionParams& p = w.p;
  const KvPages& kv = w.kv;
  const int group = p.n_heads / p.n_kv_heads, hd = p.head_dim, heads_per_item = w.heads_per_item;
  std::vector<float> scores, max_score(static_cast<size_t>(heads_per_item)), inv(max_score.size());
  std::vector<float> row_buf(static_cast<size_t>(hd));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / (p.n_kv_heads * w.items_per_kv);
    const int kv_h = static_cast<int>(item / w.items_per_kv % p.n_kv_heads);
    const int h0 = kv_h * group + static_cast<int>(item % w.items_per_kv) * heads_per_item;
    const int heads = std::min(heads_per_item, (kv_h + 1) * group - h0);
    const int64_t pos = w.positions[t];
    const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
    const int64_t count = pos - first + 1;
    scores.resize(static_cast<size_t>(heads * count));  // [head][key]

    const float* qg = w.q + t * w.ldq + static_cast<int64_t>(h0) * hd;
    std::fill(max_score.begin(), max_score.end(), -INFINITY);
    for_each_kv_row(kv, t, first, count, [&](int64_t j, int64_t row) __attribute__((always_inline)) {
      const float* kj = head_row(kv.k, kv.codec.key, kv.ld, row, kv_h, hd, row_buf.data());
      for (int h = 0; h < heads; ++h) {
        float s = dot(qg + static_cast<int64_t>(h) * hd, kj, hd) * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        scores[static_cast<size_t>(h * count + j)] = s;
        max_score[static_cast<size_t>(h)] = std::max(max_score[static_cast<size_t>(h)], s);
      }
    });
    float* og = w.out + t * w.ldo + static_cast<int64_t>(h0) * hd;
    for (int h = 0; h < heads; ++h) {
      float denom = 0.0f;
      float* sh = scores.data() + static_cast<size_t>(h) * count;
      for (int64_t j = 0; j < count; ++j) {
        sh[j] = std::exp(sh[j] - max_score[static_cast<size_t>(h)]);
        denom += sh[j];
      }
      inv[static_cast<size_t>(h)] = 1.0f / denom;
      std::fill(og + static_cast<int64_t>(h) * hd, og + static_cast<int64_t>(h + 1) * hd, 0.0f);
    }
    for_each_kv_row(kv, t, first, count, [&](int64_t j, int64_t row) __attribute__((always_inline)) {
      const float* vj = head_row(kv.v, kv.codec.value, kv.ld, row, kv_h, hd, row_buf.data());
      for (int h = 0; h < heads; ++h)
        axpy(og + static_cast<int64_t>(h) * hd, scores[static_cast<size_t>(h * count + j)] * inv[static_cast<size_t>(h)],
             vj, hd);
    });
  }
}

void attend(ThreadPool& pool, const float* q, int64_t n, int64_t ldq, const KvPages& kv, const int32_t* positions,
            const AttentionParams& p, float* out, int64_t ldo) {
  const int group = p.n_heads / p.n_kv_heads;
  const int64_t per_kv = std::clamp<int64_t>(2 * pool.size() / std::max<int64_t>(1, n * p.n_kv_heads), 1, group);
  const int heads_per_item = static_cast<int>((group + per_kv - 1) / per_kv);
  const int items_per_kv = (group + heads_per_item - 1) / heads_per_item;
  const AttendItems work{q, ldq, kv, positions, p, out, ldo, heads_per_item, items_per_kv};
  pool.parallel_for(n * p.n_kv_heads * items_per_kv, 1,
                    [&work](int64_t begin, int64_t end) { attend_items(work, begin, end); });
}

}  // namespace
}  // namespace kettle::cpu
