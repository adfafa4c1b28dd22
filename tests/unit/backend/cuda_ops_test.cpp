// Every CUDA op but the matmuls (cuda_matmul_test.cpp) against the CPU op (the
// reference backend) on fresh random inputs, device outputs poisoned (NaN) before each run. bf16 weights on
// both sides; tolerances are bf16 bounds where the GPU rounds activations to
// bf16 (the cuBLAS path), f32 bounds elsewhere. Skipped (not passed) where no
// CUDA device is present or kettle was built without CUDA; ctest label: cuda.
// The KV cache is paged: tables shuffled, unused pool rows NaN.
#include <cstring>

#include "kv/kv_quant.h"
#include "unit/backend/cuda_test_support.h"

namespace kettle::cuda_test {
namespace {

TEST_F(CudaOpsTest, RmsNorm) {
  for (bool add_one : {false, true}) {
    const int64_t rows = 3, dim = 2048;
    auto x = random_vec(static_cast<size_t>(rows * dim), rng_);
    auto y = random_vec(static_cast<size_t>(rows * dim), rng_);
    Bf16Weight w({dim}, rng_);
    Tensor gw = gpu_->resident(w.tensor);
    std::vector<float> ref(x.size(), NAN);
    cpu_->rms_norm(x.data(), rows, dim, dim, w.tensor, 1e-6f, add_one, ref.data(), dim);
    auto dx = up(x);
    auto dout = poisoned(x.size());
    gpu_->rms_norm(dx.data(), rows, dim, dim, gw, 1e-6f, add_one, dout.data(), dim);
    EXPECT_LE(rel_err(down(dout), ref), 1e-5);
  }
}

TEST_F(CudaOpsTest, EmbedSoftcapAdd) {
  const int64_t vocab = 50, dim = 96;
  Bf16Weight table({vocab, dim}, rng_);
  std::vector<int32_t> ids = {3, 49, 0, 3};
  std::vector<float> ref(ids.size() * dim);
  cpu_->embed(ids.data(), 4, Linear{table.tensor}, 1.7f, ref.data());
  auto dids = up(ids);
  auto dout = poisoned(ref.size());
  gpu_->embed(dids.data(), 4, Linear{gpu_->resident(table.tensor)}, 1.7f, dout.data());
  EXPECT_LE(rel_err(down(dout), ref), 1e-6);

  auto x = random_vec(1000, rng_, 5.0f), y = random_vec(1000, rng_);
  auto dx = up(x), dy = up(y);
  cpu_->softcap(x.data(), 1000, 3.0f);
  gpu_->softcap(dx.data(), 1000, 3.0f);
  EXPECT_LE(rel_err(down(dx), x), 1e-6);
  cpu_->add(x.data(), y.data(), 1000);
  gpu_->add(dx.data(), dy.data(), 1000);
  EXPECT_LE(rel_err(down(dx), x), 1e-6);
}

// A paged KV pool: each sequence's blocks drawn from a shuffled pool (with spare blocks
// no table names), rows outside every sequence NaN, so a read through a wrong row shows.
struct PagedKv {
  int block_size = 0;
  int64_t ld = 0, stride = 0;                // table stride: the longest table
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<float> k, v;                   // [pool rows, ld]

  PagedKv(const std::vector<int64_t>& lengths, int block, int64_t row_floats, std::mt19937_64& rng, bool fill)
      : block_size(block), ld(row_floats) {
    int64_t blocks = 3;  // spares
    for (int64_t len : lengths) {
      stride = std::max(stride, (len + block - 1) / block);
      blocks += (len + block - 1) / block;
    }
    std::vector<int32_t> order(static_cast<size_t>(blocks));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    size_t next = 0;
    for (int64_t len : lengths) {
      // Unused table slots name a spare (NaN) block rather than garbage.
      std::vector<int32_t> table(static_cast<size_t>(stride), order.back());
      for (int64_t b = 0; b < (len + block - 1) / block; ++b) table[static_cast<size_t>(b)] = order[next++];
      tables.push_back(table);
    }
    const size_t floats = static_cast<size_t>(blocks * block * ld);
    k.assign(floats, fill ? NAN : 0.0f);
    v = k;
    if (!fill) return;
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t s = 0; s < lengths.size(); ++s)
      for (int64_t r = 0; r < lengths[s]; ++r)
        for (int64_t i = 0; i < ld; ++i) {
          k[static_cast<size_t>(row(s, r) * ld + i)] = d(rng);
          v[static_cast<size_t>(row(s, r) * ld + i)] = d(rng);
        }
  }
  int64_t row(size_t seq, int64_t r) const {
    return static_cast<int64_t>(tables[seq][static_cast<size_t>(r / block_size)]) * block_size + r % block_size;
  }
  // Tables for a call: per query (its sequence's table each, stride `stride`) or one shared.
  std::vector<int32_t> call_tables(const std::vector<size_t>& seq_of_query) const {
    std::vector<int32_t> out;
    for (size_t s : seq_of_query) out.insert(out.end(), tables[s].begin(), tables[s].end());
    return out;
  }
};

TEST_F(CudaOpsTest, QkvRopeStoreWithNormsAndPartialRotationIntoPages) {
  const int heads = 4, kv_heads = 2, hd = 64, rot = 32;
  const int64_t ld = (heads + 2 * kv_heads) * hd + 8, qs = heads * hd, kvs = kv_heads * hd;
  std::vector<float> inv(rot / 2);
  for (int i = 0; i < rot / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / rot);
  Bf16Weight qn({hd}, rng_), kn({hd}, rng_);
  Tensor gqn = gpu_->resident(qn.tensor), gkn = gpu_->resident(kn.tensor);
  auto dinv = up(inv);
  for (int block : {16, 7, 64}) {
    for (bool shared : {false, true}) {  // one token per sequence (own tables), or a prompt chunk of one
      for (bool norms : {false, true}) {
        const std::vector<int64_t> lengths = shared ? std::vector<int64_t>{42} : std::vector<int64_t>{1, 18, 40, 130};
        std::vector<int32_t> pos;
        std::vector<size_t> seqs;
        if (shared) {
          for (int32_t p = 37; p < 42; ++p) pos.push_back(p);  // a chunk starting mid-sequence
          seqs = {0};
        } else {
          for (size_t s = 0; s < lengths.size(); ++s) {
            pos.push_back(static_cast<int32_t>(lengths[s] - 1));
            seqs.push_back(s);
          }
        }
        const int64_t n = static_cast<int64_t>(pos.size());
        PagedKv cache(lengths, block, kvs, rng_, false);
        auto tables = cache.call_tables(seqs);
        const int64_t stride = shared ? 0 : cache.stride;
        auto qkv = random_vec(static_cast<size_t>(n * ld), rng_);
        QkvLayout cpu_layout{heads, kv_heads, hd, norms ? &qn.tensor : nullptr, norms ? &kn.tensor : nullptr,
                             1e-6f, false};
        std::vector<float> q(static_cast<size_t>(n * qs), NAN), kc = cache.k, vc = cache.v;
        cpu_->qkv_rope_store(qkv.data(), n, ld, cpu_layout, pos.data(), RopeParams{inv.data(), rot, 1.2f}, q.data(),
                             KvPages{kc.data(), vc.data(), kvs, block, tables.data(), stride, {}});
        QkvLayout gpu_layout = cpu_layout;
        gpu_layout.q_norm = norms ? &gqn : nullptr;
        gpu_layout.k_norm = norms ? &gkn : nullptr;
        auto dqkv = up(qkv);
        auto dpos = up(pos);
        auto dtables = up(tables);
        auto dq = poisoned(q.size());
        auto dk = kv_upload(*gpu_, cache.k), dv = kv_upload(*gpu_, cache.v);
        gpu_->qkv_rope_store(dqkv.data(), n, ld, gpu_layout, dpos.data(), RopeParams{dinv.data(), rot, 1.2f}, dq.data(),
                             KvPages{dk.data(), dv.data(), kvs, block, dtables.data(), stride, f16_rows()});
        const std::string what = "block " + std::to_string(block) + (shared ? " shared table" : " per-token tables") +
                                 " norms " + std::to_string(norms);
        EXPECT_LE(rel_err(down(dq), q), 1e-5) << what;
        // The whole pool: other rows untouched. f16 keeps 11 significant bits.
        const double kv_bound = dtype_size(gpu_->kv_dtype()) == sizeof(float) ? 1e-5 : 1e-3;
        EXPECT_LE(rel_err(kv_download(*gpu_, dk), kc), kv_bound) << what;
        EXPECT_LE(rel_err(kv_download(*gpu_, dv), vc), kv_bound) << what;
      }
    }
  }
}

// Quantized KV rows (--kv-quant): the GPU's store writes exactly the bytes the codec's host
// encoding gives the same rows (no norm, no rotary dims: the rows as projected), and both
// attention kernels — the prompt chunk's and the decode's — read those bytes as the CPU's
// attention does (itself checked against a double reference in ops_test) within f16's
// rounding of the decoded values. Heads of 128 or 64; two KV heads of 128: rows the kernels
// read 16 elements a load (kv_pieces_fit); one: rows of 136 bytes at 8 bits, read 8 elements
// at a time. 40 queries
// fit one key tile and one decode chunk; 300 take several of each.
TEST_F(CudaOpsTest, QuantizedKvRowsAreStoredAsTheCodecAndReadAsOnTheCpu) {
  for (const int hd : {128, 64})
    for (const int kv_heads : {2, 1})
      for (const int64_t n : {int64_t{40}, int64_t{300}}) {
        SCOPED_TRACE(std::to_string(kv_heads) + " KV heads of " + std::to_string(hd) + ", " + std::to_string(n) + " tokens");
        expect_quantized_kv_rows(hd, kv_heads, n);
      }
}

}  // namespace

void CudaOpsTest::expect_quantized_kv_rows(int hd, int kv_heads, int64_t n) {
  const int heads = 8, block = 16;
  const int64_t width = (heads + 2 * kv_heads) * hd, qs = heads * hd, kvs = kv_heads * hd;
  const int64_t blocks = (n + block - 1) / block;
  std::vector<int32_t> table, pos;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(blocks - b));  // block 0 unused, reversed
  for (int64_t t = 0; t < n; ++t) pos.push_back(static_cast<int32_t>(t));
  const std::vector<float> no_rotation = {1.0f};
  auto dtable = up(table), dpos = up(pos);
  auto dinv = up(no_rotation);
  for (const char* mode : {"8", "4", "fp8", "turbo", "turbo:k4v2"}) {
    const KvCodec codec = parse_kv_quant(mode).codec_for(0, KvLayer::Kind::kFull, hd, DType::kF16);
    ASSERT_TRUE(gpu_->runs_kv(codec.key) && gpu_->runs_kv(codec.value)) << mode;
    const size_t kb = codec.key.row_bytes(kvs), vb = codec.value.row_bytes(kvs);
    const size_t pool_rows = static_cast<size_t>((blocks + 1) * block);
    auto qkv = random_vec(static_cast<size_t>(n * width), rng_);
    BackendArray<uint8_t> dk(*gpu_, pool_rows * kb), dv(*gpu_, pool_rows * vb);
    const std::vector<uint8_t> zeros(std::max(dk.size(), dv.size()), 0);
    gpu_->to_device(dk.data(), zeros.data(), dk.bytes());
    gpu_->to_device(dv.data(), zeros.data(), dv.bytes());
    auto dqkv = up(qkv);
    auto dq = poisoned(static_cast<size_t>(n * qs));
    const KvPages gpu_pages{dk.data(), dv.data(), kvs, block, dtable.data(), 0, codec};
    gpu_->qkv_rope_store(dqkv.data(), n, width, QkvLayout{heads, kv_heads, hd}, dpos.data(), RopeParams{dinv.data(), 0, 1.0f},
                         dq.data(), gpu_pages);
    std::vector<uint8_t> k(dk.size()), v(dv.size());
    gpu_->to_host(k.data(), dk.data(), dk.bytes());
    gpu_->to_host(v.data(), dv.data(), dv.bytes());
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = table[static_cast<size_t>(t / block)] * int64_t{block} + t % block;
      std::vector<uint8_t> want_k(kb), want_v(vb);
      kv_encode_row(codec.key, qkv.data() + t * width + qs, kvs, hd, want_k.data());
      kv_encode_row(codec.value, qkv.data() + t * width + qs + kvs, kvs, hd, want_v.data());
      ASSERT_TRUE(std::equal(want_k.begin(), want_k.end(), k.begin() + row * static_cast<int64_t>(kb))) << mode << " keys of " << t;
      ASSERT_TRUE(std::equal(want_v.begin(), want_v.end(), v.begin() + row * static_cast<int64_t>(vb))) << mode << " values of " << t;
    }
    // Attention over those bytes: the whole chunk (one shared table), then each query with a
    // table of its own (the decode kernel).
    const AttentionParams p{heads, kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd)), 0.0f, 0};
    auto q = random_vec(static_cast<size_t>(n * qs), rng_);
    auto dq2 = up(q);
    std::vector<int32_t> own_tables;
    for (int64_t t = 0; t < n; ++t) own_tables.insert(own_tables.end(), table.begin(), table.end());
    auto downs = up(own_tables);
    for (const int64_t stride : {int64_t{0}, blocks}) {
      std::vector<float> ref(static_cast<size_t>(n * qs), NAN);
      cpu_->attention(q.data(), n, qs, KvPages{k.data(), v.data(), kvs, block, stride ? own_tables.data() : table.data(), stride, codec},
                      pos.data(), n, p, ref.data(), qs);
      auto dout = poisoned(ref.size());
      gpu_->attention(dq2.data(), n, qs, KvPages{dk.data(), dv.data(), kvs, block, stride ? downs.data() : dtable.data(), stride, codec},
                      dpos.data(), n, p, dout.data(), qs);
      EXPECT_LE(rel_err(down(dout), ref), 2e-3) << mode << (stride ? " decode kernel" : " prompt kernel");
    }
  }
}

namespace {

// The CPU op and the GPU op over one paged pool; returns the relative error.
double paged_attention_error(Backend& cpu, Backend& gpu, const AttentionParams& p, const PagedKv& cache,
                             const std::vector<int32_t>& pos, const std::vector<size_t>& seqs, bool shared,
                             int64_t max_kv, std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(pos.size()), qs = p.n_heads * p.head_dim, ldq = qs + 16;
  auto q = random_vec(static_cast<size_t>(n * ldq), rng);
  auto tables = shared ? cache.tables[0] : cache.call_tables(seqs);
  const int64_t stride = shared ? 0 : cache.stride;
  std::vector<float> ref(static_cast<size_t>(n * qs), NAN);
  auto ck = kv_rounded(gpu, cache.k), cv = kv_rounded(gpu, cache.v);  // the values the GPU holds
  cpu.attention(q.data(), n, ldq, KvPages{ck.data(), cv.data(), cache.ld, cache.block_size, tables.data(), stride, {}},
                pos.data(), max_kv, p, ref.data(), qs);
  const auto up = [&](const auto& host) {
    using T = typename std::decay_t<decltype(host)>::value_type;
    BackendArray<T> a(gpu, host.size());
    gpu.to_device(a.data(), host.data(), a.bytes());
    return a;
  };
  auto dq = up(q);
  auto dk = kv_upload(gpu, cache.k), dv = kv_upload(gpu, cache.v);
  auto dpos = up(pos);
  auto dtables = up(tables);
  auto dout = up(std::vector<float>(ref.size(), NAN));
  gpu.attention(dq.data(), n, ldq, KvPages{dk.data(), dv.data(), cache.ld, cache.block_size, dtables.data(), stride, f16_rows()},
                dpos.data(), max_kv, p, dout.data(), qs);
  std::vector<float> out(ref.size());
  gpu.to_host(out.data(), dout.data(), dout.bytes());
  return rel_err(out, ref);
}

TEST_F(CudaOpsTest, AttentionPromptChunkThroughOneSharedTable) {
  struct Case {
    int heads, kv_heads, hd;
    int64_t n, start, max_kv;
    int window;
    float softcap;
  };
  // One shared table: the tensor-core prompt kernel, whose q and p enter the MMAs as f16
  // (11 significant bits, as the cache holds k and v): a relative error of a few 1e-4.
  constexpr double kF16Tolerance = 2e-3;
  const Case cases[] = {{32, 8, 64, 1, 130, 256, 0, 0.0f},     {32, 8, 128, 1, 700, 1024, 0, 0.0f},
                        {6, 2, 16, 7, 9, 16, 5, 2.0f},         {16, 8, 128, 40, 300, 340, 0, 0.0f},
                        {8, 4, 256, 20, 0, 20, 8, 50.0f},      {12, 12, 64, 1, 5000, 8192, 4096, 0.0f},
                        {8, 2, 64, 3, 61, 64, 0, 30.0f},       {16, 4, 128, 100, 900, 1000, 256, 0.0f},
                        {16, 8, 96, 130, 70, 200, 0, 0.0f},    {4, 2, 72, 65, 10, 75, 0, 0.0f},
                        {8, 8, 256, 150, 40, 190, 100, 30.0f}, {32, 8, 128, 2500, 0, 2500, 0, 0.0f},
                        {8, 2, 128, 700, 1500, 2200, 1000, 0.0f}};
  for (int block : {16, 7, 64}) {
    for (const Case& c : cases) {
      AttentionParams p{c.heads, c.kv_heads, c.hd, 1.0f / std::sqrt(static_cast<float>(c.hd)), c.softcap, c.window};
      PagedKv cache({c.start + c.n}, block, c.kv_heads * c.hd, rng_, true);
      std::vector<int32_t> pos;
      for (int64_t t = 0; t < c.n; ++t) pos.push_back(static_cast<int32_t>(c.start + t));
      EXPECT_LE(paged_attention_error(*cpu_, *gpu_, p, cache, pos, {0}, true, c.max_kv, rng_), kF16Tolerance)
          << "block " << block << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " n " << c.n
          << " start " << c.start << " window " << c.window << " softcap " << c.softcap;
    }
  }
}

// A prompt's query gets the same bits in any chunk: every prompt chunk, one query or
// many, goes through the tiled kernel, whose sums per query do not depend on the others
// (the whole prompt runs with two row blocks per warp, the short chunks with one).
TEST_F(CudaOpsTest, AttentionPromptQueryIsTheSameBitsInAnyChunk) {
  const int64_t len = 2500;
  for (int window : {0, 256}) {
    AttentionParams p{32, 8, 128, 1.0f / std::sqrt(128.0f), window > 0 ? 30.0f : 0.0f, window};
    const int64_t qs = p.n_heads * p.head_dim;
    PagedKv cache({len}, 16, p.n_kv_heads * p.head_dim, rng_, true);
    auto q = random_vec(static_cast<size_t>(len * qs), rng_);
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < len; ++t) pos.push_back(static_cast<int32_t>(t));
    auto dq = up(q);
    auto dk = kv_upload(*gpu_, cache.k), dv = kv_upload(*gpu_, cache.v);
    auto dpos = up(pos);
    auto dtable = up(cache.tables[0]);
    const auto run = [&](int64_t first, int64_t n) {
      auto out = poisoned(static_cast<size_t>(n * qs));
      gpu_->attention(dq.data() + first * qs, n, qs, KvPages{dk.data(), dv.data(), cache.ld, 16, dtable.data(), 0, f16_rows()},
                      dpos.data() + first, len, p, out.data(), qs);
      return down(out);
    };
    const auto whole = run(0, len);
    for (int64_t first : {int64_t{0}, int64_t{333}, len - 5, len - 1}) {
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}}) {
        if (first + n > len) continue;
        std::vector<std::vector<float>> expected;
        for (int64_t t = first; t < first + n; ++t)
          expected.emplace_back(whole.begin() + t * qs, whole.begin() + (t + 1) * qs);
        EXPECT_EQ(rows_differing(run(first, n), expected, qs, qs), 0)
            << "window " << window << ": queries [" << first << ", " << first + n << ")";
      }
    }
  }
}

TEST_F(CudaOpsTest, AttentionSequencesOfDifferentLengthsWithOwnTables) {
  struct Case {
    int heads, kv_heads, hd;
    int window;
    float softcap;
  };
  const Case cases[] = {
      {32, 8, 128, 0, 0.0f}, {8, 8, 64, 0, 0.0f}, {6, 2, 16, 5, 2.0f}, {8, 4, 256, 300, 50.0f}, {16, 8, 96, 0, 30.0f}};
  std::uniform_int_distribution<int64_t> len(1, 1500);
  for (int block : {16, 7, 64}) {
    for (const Case& c : cases) {
      AttentionParams p{c.heads, c.kv_heads, c.hd, 1.0f / std::sqrt(static_cast<float>(c.hd)), c.softcap, c.window};
      // Seven sequences (one of length 1); the last two bring three and two tokens, so the
      // call has more queries than the decode cutoff but must not take the one-table kernel.
      // With block 64 two are long: past 64 chunks of 128 keys, so their chunks double.
      std::vector<int64_t> lengths = {1};
      for (int s = 0; s < 6; ++s) lengths.push_back(len(rng_));
      if (block == 64) lengths[2] = 20000, lengths[5] = 8193;
      PagedKv cache(lengths, block, c.kv_heads * c.hd, rng_, true);
      std::vector<int32_t> pos;
      std::vector<size_t> seqs;
      int64_t max_kv = 0;
      for (size_t s = 0; s < lengths.size(); ++s) {
        const int64_t tokens = s == 5 ? 3 : s == 6 ? 2 : 1;
        for (int64_t t = std::max<int64_t>(0, lengths[s] - tokens); t < lengths[s]; ++t) {
          pos.push_back(static_cast<int32_t>(t));
          seqs.push_back(s);
        }
        max_kv = std::max(max_kv, lengths[s]);
      }
      for (int64_t bound : {max_kv, max_kv + 700}) {  // a recorded step may pass a bound above the lengths
        EXPECT_LE(paged_attention_error(*cpu_, *gpu_, p, cache, pos, seqs, false, bound, rng_), 1e-5)
            << "block " << block << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " window "
            << c.window << " softcap " << c.softcap << " max_kv " << bound;
      }
    }
  }
}

// Pool rows of `kvs` elements in a codec's bytes (plain rows: f16).
std::vector<uint8_t> kv_rows_of(const KvRowCodec& c, const std::vector<float>& x, int64_t kvs, int hd) {
  const int64_t rows = static_cast<int64_t>(x.size()) / kvs;
  const size_t rb = c.quantized() ? c.row_bytes(kvs) : static_cast<size_t>(kvs) * 2;
  std::vector<uint8_t> out(static_cast<size_t>(rows) * rb);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + static_cast<size_t>(r) * rb;
    if (c.quantized()) {
      kv_encode_row(c, x.data() + r * kvs, kvs, hd, row);
      continue;
    }
    for (int64_t i = 0; i < kvs; ++i) {
      const uint16_t h = f32_to_f16(x[static_cast<size_t>(r * kvs + i)]);
      std::memcpy(row + 2 * i, &h, 2);
    }
  }
  return out;
}

// A decode query's bits do not depend on the step's bound (the longest sequence beside it):
// alone, its keys may fit one chunk (the block writes the result itself), while beside a
// long sequence the same keys are one chunk of many (the last block merges) — both must
// give the same bits, or a token changes with the batch (kettle-demo under turbo did).
TEST_F(CudaOpsTest, AttentionDecodeQueryIsTheSameBitsWhateverTheStepsBound) {
  struct Case {
    int heads, kv_heads, hd;
  };
  const int block = 16;
  const std::vector<int32_t> positions = {0, 3, 100, 127, 128, 129, 700, 9000};
  const int64_t blocks = 9001 / block + 1;
  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(b + 1));  // block 0 unused
  for (const Case& c : {Case{6, 2, 64}, Case{32, 8, 128}}) {
    const int64_t qs = c.heads * c.hd, kvs = c.kv_heads * c.hd, n = static_cast<int64_t>(positions.size());
    const AttentionParams p{c.heads, c.kv_heads, c.hd, 1.0f / std::sqrt(static_cast<float>(c.hd)), 0.0f, 0};
    const auto k = random_vec(static_cast<size_t>((blocks + 1) * block * kvs), rng_);
    const auto v = random_vec(k.size(), rng_);
    const auto q = random_vec(static_cast<size_t>(n * qs), rng_);
    std::vector<int32_t> tables;
    for (int64_t t = 0; t < n; ++t) tables.insert(tables.end(), table.begin(), table.end());
    auto dq = up(q);
    auto dpos = up(positions);
    auto dtables = up(tables);
    for (const char* mode : {"off", "8", "4", "turbo"}) {
      const KvCodec codec = std::string(mode) == "off"
                                ? f16_rows()
                                : parse_kv_quant(mode).codec_for(0, KvLayer::Kind::kFull, c.hd, DType::kF16);
      auto dk = up(kv_rows_of(codec.key, k, kvs, c.hd));
      auto dv = up(kv_rows_of(codec.value, v, kvs, c.hd));
      const auto run = [&](int64_t first, int64_t count, int64_t bound) {
        auto out = poisoned(static_cast<size_t>(count * qs));
        gpu_->attention(dq.data() + first * qs, count, qs,
                        KvPages{dk.data(), dv.data(), kvs, block, dtables.data() + first * blocks, blocks, codec},
                        dpos.data() + first, bound, p, out.data(), qs);
        return down(out);
      };
      const auto together = run(0, n, 16384);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t own = (positions[static_cast<size_t>(t)] / block + 1) * block;  // its own table's keys
        const std::vector<float> expected(together.begin() + t * qs, together.begin() + (t + 1) * qs);
        EXPECT_EQ(rows_differing(run(t, 1, own), {expected}, qs, qs), 0)
            << mode << ", hd " << c.hd << ": the query at " << positions[static_cast<size_t>(t)] << " alone";
      }
    }
  }
}

// Where the CPU's rule puts boundaries for a row: the running kept mass at each kept
// token over the kept total (the uniform picks the first token whose boundary exceeds it).
std::vector<double> kept_mass_boundaries(const float* logits, int64_t vocab, const SampleRow& row) {
  std::vector<std::pair<float, int32_t>> c(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    c[static_cast<size_t>(i)] = {logits[i] / row.temperature, static_cast<int32_t>(i)};
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = row.top_k > 0 ? std::min<size_t>(static_cast<size_t>(row.top_k), c.size()) : c.size();
  const double top = c[0].first;
  const auto w = [&](size_t i) { return std::exp(static_cast<double>(c[i].first) - top); };
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += w(i);
  if (row.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += w(i) / sum;
      if (mass >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (row.min_p > 0.0f) {
    size_t cut = 1;
    while (cut < keep && w(cut) / sum >= row.min_p / sum) ++cut;
    keep = cut;
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += w(i);
  std::vector<double> out;
  double run = 0.0;
  for (size_t i = 0; i < keep; ++i) out.push_back((run += w(i)) / kept);
  return out;
}

TEST_F(CudaOpsTest, SampleMatchesTheCpuRule) {
  const int64_t rows = 160, vocab = 32000;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  std::vector<SampleRow> params(static_cast<size_t>(rows));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.6f};
  const int top_ks[] = {0, 0, 1, 5, 50, 1000, 40000};
  const float top_ps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.99f, 0.0f};
  const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.3f};
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits.data() + r * vocab;
    const float scale = std::array<float, 4>{0.5f, 2.0f, 5.0f, 12.0f}[static_cast<size_t>(r % 4)];
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < vocab; ++i) x[i] = d(rng_);
    if (r % 5 == 1)  // coarse logits: many exact ties, also at the top
      for (int64_t i = 0; i < vocab; ++i) x[i] = std::round(x[i] * 2.0f) / 2.0f;
    if (r % 7 == 2)  // masked tokens
      for (int64_t i = 0; i < vocab; i += 3) x[i] = -INFINITY;
    if (r % 11 == 3) x[r * 37 % vocab] = x[r * 53 % vocab] = 40.0f;  // two equal peaks
    SampleRow& p = params[static_cast<size_t>(r)];
    p.temperature = temps[static_cast<size_t>(r % 5)];
    p.top_k = top_ks[static_cast<size_t>((r / 5) % 7)];
    p.top_p = top_ps[static_cast<size_t>((r / 3) % 6)];
    p.min_p = min_ps[static_cast<size_t>((r / 2) % 4)];
    p.uniform = r % 13 == 0 ? 0.0f : r % 13 == 1 ? std::nextafter(1.0f, 0.0f) : unit(rng_);
    if (p.uniform >= 1.0f) p.uniform = 0.5f;
  }
  std::vector<int32_t> ref(static_cast<size_t>(rows));
  cpu_->sample(logits.data(), rows, vocab, params.data(), ref.data());
  auto dlogits = up(logits);
  auto dparams = up(params);
  auto dids = up(std::vector<int32_t>(static_cast<size_t>(rows), -7));
  gpu_->sample(dlogits.data(), rows, vocab, dparams.data(), dids.data());
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  gpu_->to_host(ids.data(), dids.data(), dids.bytes());
  int differing = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRow& p = params[static_cast<size_t>(r)];
    if (ids[static_cast<size_t>(r)] == ref[static_cast<size_t>(r)]) continue;
    ++differing;
    ASSERT_GT(p.temperature, 0.0f) << "greedy row " << r << " differs";
    double nearest = INFINITY;
    for (double b : kept_mass_boundaries(logits.data() + r * vocab, vocab, p))
      nearest = std::min(nearest, std::abs(b - static_cast<double>(p.uniform)));
    EXPECT_LT(nearest, 1e-5) << "row " << r << ": gpu " << ids[static_cast<size_t>(r)] << " cpu "
                             << ref[static_cast<size_t>(r)] << ", uniform " << p.uniform << " not at a boundary";
  }
  EXPECT_LE(differing, 2) << "rows drawn differently from the CPU (at mass boundaries): " << differing;
  // Reruns draw the same ids (no state left behind).
  gpu_->sample(dlogits.data(), rows, vocab, dparams.data(), dids.data());
  std::vector<int32_t> again(static_cast<size_t>(rows));
  gpu_->to_host(again.data(), dids.data(), dids.bytes());
  EXPECT_EQ(again, ids);
}

// Constrained decoding's masks: the same -inf logits as the CPU op, and the greedy draw after
// them the allowed maximum.
TEST_F(CudaOpsTest, MaskLogitsMatchesTheCpu) {
  const int64_t rows = 5, vocab = 32003, words = (vocab + 31) / 32;
  std::vector<float> logits = random_vec(static_cast<size_t>(rows * vocab), rng_, 4.0f);
  std::vector<uint32_t> masks(static_cast<size_t>(rows * words));
  std::uniform_int_distribution<uint32_t> bits;
  for (size_t i = 0; i < masks.size(); ++i) masks[i] = i % 7 == 0 ? 0xFFFFFFFFu : bits(rng_) & bits(rng_);
  std::vector<float> ref = logits;
  cpu_->mask_logits(ref.data(), rows, vocab, masks.data());
  auto dlogits = up(logits);
  auto dmasks = up(masks);
  gpu_->mask_logits(dlogits.data(), rows, vocab, dmasks.data());
  std::vector<float> got(logits.size());
  gpu_->to_host(got.data(), dlogits.data(), dlogits.bytes());
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)));
  std::vector<int32_t> want(static_cast<size_t>(rows));
  cpu_->argmax(ref.data(), rows, vocab, want.data());
  auto dids = up(std::vector<int32_t>(static_cast<size_t>(rows), -7));
  gpu_->argmax(dlogits.data(), rows, vocab, dids.data());
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  gpu_->to_host(ids.data(), dids.data(), dids.bytes());
  EXPECT_EQ(ids, want);
  for (int64_t r = 0; r < rows; ++r) {
    const auto id = static_cast<size_t>(ids[static_cast<size_t>(r)]);
    EXPECT_TRUE((masks[static_cast<size_t>(r * words) + id / 32] >> (id % 32)) & 1u) << "row " << r;
  }
}

// The serving engine's pattern: greedy draws over a batch whose row count changes every
// step (sequences join and leave), and single-row argmaxes between. Every call must give
// each row's first maximum whatever the calls before it left in the workspaces.
TEST_F(CudaOpsTest, GreedyDrawsWhileTheRowCountChanges) {
  const int64_t vocab = 4099;
  for (int64_t rows : {3, 16, 1, 24, 7, 64, 2, 40}) {
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (auto& x : logits) x = d(rng_);
    std::vector<int32_t> ref(static_cast<size_t>(rows));
    cpu_->argmax(logits.data(), rows, vocab, ref.data());
    auto dlogits = up(logits);
    auto dparams = up(std::vector<SampleRow>(static_cast<size_t>(rows)));
    auto dids = up(std::vector<int32_t>(static_cast<size_t>(rows), -7));
    for (bool through_sample : {true, false}) {
      if (through_sample)
        gpu_->sample(dlogits.data(), rows, vocab, dparams.data(), dids.data());
      else
        gpu_->argmax(dlogits.data(), rows, vocab, dids.data());
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      gpu_->to_host(ids.data(), dids.data(), dids.bytes());
      EXPECT_EQ(ids, ref) << rows << " rows, " << (through_sample ? "sample" : "argmax");
    }
  }
}

// Not a check: the decode-time costs the step pays, printed for the log.
TEST_F(CudaOpsTest, TimingSampleAndPagedDecodeAttention) {
  {
    const int64_t rows = 64, vocab = 128256;
    auto logits = random_vec(static_cast<size_t>(rows * vocab), rng_, 3.0f);
    auto dlogits = up(logits);
    BackendArray<int32_t> ids(*gpu_, static_cast<size_t>(rows));
    const std::pair<const char*, SampleRow> configs[] = {
        {"greedy", SampleRow{0.0f, 0, 1.0f, 0.0f, 0.5f}},
        {"t=0.7 top_p=0.9", SampleRow{0.7f, 0, 0.9f, 0.0f, 0.5f}},
        {"t=1 top_k=50 top_p=0.95", SampleRow{1.0f, 50, 0.95f, 0.0f, 0.5f}},
        {"t=1.5 (all tokens)", SampleRow{1.5f, 0, 1.0f, 0.0f, 0.97f}},
        {"t=0.8 min_p=0.05", SampleRow{0.8f, 0, 1.0f, 0.05f, 0.3f}}};
    for (const auto& [name, row] : configs) {
      auto dparams = up(std::vector<SampleRow>(static_cast<size_t>(rows), row));
      const double us = time_us(20, [&] { gpu_->sample(dlogits.data(), rows, vocab, dparams.data(), ids.data()); });
      std::printf("sample %lld x %lld, %-24s %8.1f us\n", static_cast<long long>(rows), static_cast<long long>(vocab),
                  name, us);
    }
  }
  // One sequence (single-stream decode) first, then batches (llama-3.1-8b's heads).
  for (const auto& [seqs, keys] : {std::pair<int64_t, int64_t>{1, 128}, {1, 1000}, {1, 8192}, {1, 32768}, {32, 1000},
                                    {64, 576}, {8, 16384}}) {
    const int heads = 32, kv_heads = 8, hd = 128, block = 16;
    int64_t max_kv = 1;
    while (max_kv < keys) max_kv *= 2;  // the decode step's bucket
    AttentionParams p{heads, kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd)), 0.0f, 0};
    PagedKv cache(std::vector<int64_t>(static_cast<size_t>(seqs), keys), block, kv_heads * hd, rng_, true);
    std::vector<int32_t> pos(static_cast<size_t>(seqs), static_cast<int32_t>(keys - 1));
    std::vector<size_t> which;
    for (size_t s = 0; s < static_cast<size_t>(seqs); ++s) which.push_back(s);
    auto tables = cache.call_tables(which);
    auto dq = up(random_vec(static_cast<size_t>(seqs * heads * hd), rng_));
    auto dk = kv_upload(*gpu_, cache.k), dv = kv_upload(*gpu_, cache.v);
    auto dpos = up(pos);
    auto dtables = up(tables);
    auto dout = poisoned(static_cast<size_t>(seqs * heads * hd));
    const KvPages kv{dk.data(), dv.data(), cache.ld, block, dtables.data(), cache.stride, f16_rows()};
    const double us = time_us(
        50, [&] { gpu_->attention(dq.data(), seqs, heads * hd, kv, dpos.data(), max_kv, p, dout.data(), heads * hd); });
    const double bytes =
        2.0 * static_cast<double>(seqs * keys * kv_heads * hd) * static_cast<double>(dtype_size(gpu_->kv_dtype()));
    std::printf("paged decode attention %lld seqs x %lld keys (32/8 heads, hd 128, block 16): %.1f us, %.0f GB/s\n",
                static_cast<long long>(seqs), static_cast<long long>(keys), us, bytes / us / 1e3);
  }
  // Prompt attention: a chunk of n queries at the end of a sequence of `keys` positions.
  for (const auto& [n, keys] : {std::pair<int64_t, int64_t>{512, 512}, {4096, 4096}, {16384, 16384}, {512, 32768}}) {
    const int heads = 32, kv_heads = 8, hd = 128, block = 16;
    AttentionParams p{heads, kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd)), 0.0f, 0};
    PagedKv cache({keys}, block, kv_heads * hd, rng_, true);
    std::vector<int32_t> pos;
    for (int64_t t = keys - n; t < keys; ++t) pos.push_back(static_cast<int32_t>(t));
    auto dq = up(random_vec(static_cast<size_t>(n * heads * hd), rng_));
    auto dk = kv_upload(*gpu_, cache.k), dv = kv_upload(*gpu_, cache.v);
    auto dpos = up(pos);
    auto dtable = up(cache.tables[0]);
    auto dout = poisoned(static_cast<size_t>(n * heads * hd));
    const KvPages kv{dk.data(), dv.data(), cache.ld, block, dtable.data(), 0, f16_rows()};
    const double us = time_us(
        5, [&] { gpu_->attention(dq.data(), n, heads * hd, kv, dpos.data(), keys, p, dout.data(), heads * hd); });
    // Causal: query t sees keys - n + t + 1 keys; 4 flops per (query, key, head, dim).
    const double pairs = static_cast<double>(n) * static_cast<double>(keys - n) + 0.5 * static_cast<double>(n * (n + 1));
    std::printf("prompt attention %lld queries over %lld keys (32/8 heads, hd 128): %.1f us, %.0f TFLOPS\n",
                static_cast<long long>(n), static_cast<long long>(keys), us, 4.0 * pairs * heads * hd / us / 1e6);
  }
}

// Decode rows through the expert GEMVs, prompt rows through the grouped GEMMs (several
// row tiles per expert at 300 rows), and a step of both; each against the CPU, and a
// prompt row the same bits whatever chunk it is in.
TEST_F(CudaOpsTest, MixtureOfExperts) {
  struct Shape {
    int64_t hidden, inter;
    int n_experts, top_k;
  };
  for (const Shape& shape : {Shape{64, 48, 8, 2}, Shape{256, 96, 16, 4}, Shape{128, 64, 128, 8}}) {
    const int64_t hidden = shape.hidden, inter = shape.inter;
    const int n_experts = shape.n_experts;
    Bf16Weight router({n_experts, hidden}, rng_);
    std::vector<Bf16Weight> weights;
    for (int e = 0; e < 3 * n_experts; ++e)
      weights.emplace_back(e % 3 == 2 ? std::vector<int64_t>{hidden, inter} : std::vector<int64_t>{inter, hidden},
                           rng_);
    std::vector<ExpertWeights> cpu_experts, gpu_experts;
    for (int e = 0; e < n_experts; ++e) {
      const Tensor& g = weights[static_cast<size_t>(3 * e)].tensor;
      const Tensor& u = weights[static_cast<size_t>(3 * e + 1)].tensor;
      const Tensor& d = weights[static_cast<size_t>(3 * e + 2)].tensor;
      cpu_experts.push_back({Linear{g}, Linear{u}, Linear{d}});
      gpu_experts.push_back({Linear{gpu_->resident(g)}, Linear{gpu_->resident(u)}, Linear{gpu_->resident(d)}});
    }
    const Linear gpu_router{gpu_->resident(router.tensor)};
    const auto run = [&](const float* dx, int64_t n, int64_t decode_rows, const MoeParams& params) {
      auto dout = poisoned(static_cast<size_t>(n * hidden));
      ctx_.decode_rows = decode_rows;
      gpu_->run_step(ctx_, 0, [&] { gpu_->moe(dx, n, hidden, gpu_router, gpu_experts, params, dout.data()); });
      return down(dout);
    };
    for (int64_t n : {1, 5, 300}) {
      auto x = random_vec(static_cast<size_t>(n * hidden), rng_);
      auto dx = up(x);
      for (bool renorm : {true, false}) {
        MoeParams params{shape.top_k, renorm, Activation::kSilu};
        std::vector<float> ref(x.size(), NAN);
        cpu_->moe(x.data(), n, hidden, Linear{router.tensor}, cpu_experts, params, ref.data());
        for (int64_t decode_rows : {int64_t{0}, n, n / 2}) {
          EXPECT_LE(rel_err(run(dx.data(), n, decode_rows, params), ref), 1e-4)
              << "hidden " << hidden << " n " << n << " decode rows " << decode_rows << " renormalize " << renorm;
        }
        if (n < 300) continue;
        const auto whole = run(dx.data(), n, 0, params);
        const auto tail = run(dx.data() + 100 * hidden, n - 100, 0, params);
        EXPECT_EQ(std::memcmp(tail.data(), whole.data() + 100 * hidden, tail.size() * sizeof(float)), 0)
            << "prompt rows [100, " << n << ") alone differ from the same rows in the whole call";
      }
    }
  }
  ctx_.decode_rows = 0;
}

// A recorded step replays with new per-step values read from device memory.
TEST_F(CudaOpsTest, RecordedStepReadsPerStepValuesFromDeviceMemory) {
  const int64_t vocab = 16, dim = 64;
  Bf16Weight table({vocab, dim}, rng_);
  Tensor gt = gpu_->resident(table.tensor);
  BackendArray<int32_t> id(*gpu_, 1);
  auto out = poisoned(static_cast<size_t>(dim));
  for (int32_t token : {3, 3, 3, 7, 11}) {  // eager, record, replay, replay, replay
    gpu_->to_device(id.data(), &token, sizeof token);
    gpu_->run_step(StepContext{}, 42, [&] { gpu_->embed(id.data(), 1, Linear{gt}, 1.0f, out.data()); });
    std::vector<float> ref(static_cast<size_t>(dim));
    cpu_->embed(&token, 1, Linear{table.tensor}, 1.0f, ref.data());
    EXPECT_EQ(down(out), ref) << "token " << token;
  }
}

}  // namespace
}  // namespace kettle::cuda_test

