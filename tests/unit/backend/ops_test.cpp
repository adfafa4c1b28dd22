// Each CPU op against a naive double-precision reference on random inputs,
// with outputs poisoned (NaN) beforehand and 1 and 3 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>

#include "backend/backend.h"
#include "kv/kv_quant.h"
#include "support/random_values.h"

namespace kettle {
namespace {

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) { return test::gaussian_values(n, seed, scale); }

// bf16 weights held for a Tensor view.
struct Bf16Weight {
  std::vector<uint16_t> bits;
  Tensor tensor;
  std::vector<double> values;  // exactly what the bits hold
  Bf16Weight(std::vector<int64_t> shape, uint64_t seed, float scale = 0.5f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = random_vec(static_cast<size_t>(n), seed, scale);
    for (float f : v) {
      bits.push_back(f32_to_bf16(f));
      values.push_back(bf16_to_f32(bits.back()));
    }
    tensor = Tensor{bits.data(), DType::kBF16, shape};
  }
};

double rel_err(const std::vector<float>& out, const std::vector<double>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d += (out[i] - ref[i]) * (out[i] - ref[i]);
    n += ref[i] * ref[i];
  }
  return std::sqrt(d / n);
}

class OpsTest : public ::testing::TestWithParam<int> {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend(GetParam());
};

TEST_P(OpsTest, RmsNorm) {
  for (bool add_one : {false, true}) {
    const int64_t rows = 5, dim = 70, ld = 80;
    auto x = random_vec(static_cast<size_t>(rows * ld), 1);
    Bf16Weight w({dim}, 2);
    std::vector<float> out(static_cast<size_t>(rows * dim), NAN);
    backend_->rms_norm(x.data(), rows, dim, ld, w.tensor, 1e-5f, add_one, out.data(), dim);
    std::vector<double> ref(out.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[static_cast<size_t>(r * ld + i)]) * x[static_cast<size_t>(r * ld + i)];
      double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t i = 0; i < dim; ++i)
        ref[static_cast<size_t>(r * dim + i)] = x[static_cast<size_t>(r * ld + i)] * inv * (w.values[static_cast<size_t>(i)] + (add_one ? 1 : 0));
    }
    EXPECT_LE(rel_err(out, ref), 1e-6) << "add_one " << add_one;
  }
}

// RoPE as qkv_rope_store applies it: q heads and the k head rotated in their first
// `rot` dims (HF rotate_half, scaled by the attention factor), v copied, k and v landing
// in the cache row of their position.
TEST_P(OpsTest, QkvRopeStoreRotatesPartiallyIntoTheCache) {
  const int64_t n = 3, heads = 2, hd = 16, rot = 8, width = (heads + 2) * hd, ld = width + 4;
  const auto x = random_vec(static_cast<size_t>(n * ld), 3);
  std::vector<float> inv = {1.0f, 0.3f, 0.01f, 0.002f};
  std::vector<int32_t> pos = {0, 7, 1000};
  std::vector<float> q(static_cast<size_t>(n * heads * hd), NAN), k(static_cast<size_t>(1024 * hd), NAN), v = k;
  const std::vector<int32_t> table = {0};
  const KvPages pages{k.data(), v.data(), hd, 1024, table.data(), 0, {}};
  backend_->qkv_rope_store(x.data(), n, ld, QkvLayout{static_cast<int>(heads), 1, static_cast<int>(hd)}, pos.data(),
                           RopeParams{inv.data(), rot, 1.5f}, q.data(), pages);
  auto rotated = [&](int64_t t, int64_t head, int64_t i) {  // head 0..heads-1: q; heads: k
    const double a0 = x[static_cast<size_t>(t * ld + head * hd + i)];
    if (i >= rot) return a0;
    const int64_t j = i % (rot / 2);
    const double angle = static_cast<double>(pos[static_cast<size_t>(t)]) * inv[static_cast<size_t>(j)];
    const double c = std::cos(angle) * 1.5, sn = std::sin(angle) * 1.5;
    const double a = x[static_cast<size_t>(t * ld + head * hd + j)], b = x[static_cast<size_t>(t * ld + head * hd + j + rot / 2)];
    return i < rot / 2 ? a * c - b * sn : b * c + a * sn;
  };
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = pos[static_cast<size_t>(t)];
    for (int64_t i = 0; i < hd; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const double expected = rotated(t, h, i);
        EXPECT_NEAR(q[static_cast<size_t>(t * heads * hd + h * hd + i)], expected, 1e-3 * (1 + std::abs(expected)))
            << t << "," << h << "," << i;
      }
      const double expected_k = rotated(t, heads, i);
      EXPECT_NEAR(k[static_cast<size_t>(row * hd + i)], expected_k, 1e-3 * (1 + std::abs(expected_k))) << t << ",k," << i;
      EXPECT_EQ(v[static_cast<size_t>(row * hd + i)], x[static_cast<size_t>(t * ld + (heads + 1) * hd + i)]) << t << ",v," << i;
    }
  }
}

void reference_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                         int64_t n, int64_t start, const AttentionParams& p, std::vector<double>& out) {
  const int64_t qs = p.n_heads * p.head_dim, kvs = p.n_kv_heads * p.head_dim;
  out.assign(static_cast<size_t>(n * qs), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < p.n_heads; ++h) {
      int kvh = h / (p.n_heads / p.n_kv_heads);
      int64_t pos = start + t;
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= pos; ++j) {
        if (p.sliding_window > 0 && pos - j >= p.sliding_window) continue;
        double dot = 0;
        for (int d = 0; d < p.head_dim; ++d)
          dot += static_cast<double>(q[static_cast<size_t>(t * qs + h * p.head_dim + d)]) * k[static_cast<size_t>(j * kvs + kvh * p.head_dim + d)];
        dot *= p.scale;
        if (p.softcap > 0) dot = p.softcap * std::tanh(dot / p.softcap);
        s.push_back(dot);
        keys.push_back(j);
      }
      double mx = *std::max_element(s.begin(), s.end()), z = 0;
      for (auto& e : s) z += e = std::exp(e - mx);
      for (size_t i = 0; i < s.size(); ++i)
        for (int d = 0; d < p.head_dim; ++d)
          out[static_cast<size_t>(t * qs + h * p.head_dim + d)] += s[i] / z * v[static_cast<size_t>(keys[i] * kvs + kvh * p.head_dim + d)];
    }
}

// Contiguous rows [total, width] scattered into a pool of `block` rows per block in a
// shuffled order (block 0 left unused, as the pool keeps it), with the table that finds them.
struct Paged {
  std::vector<float> k, v;
  std::vector<int32_t> table;
};
Paged page(const std::vector<float>& k, const std::vector<float>& v, int64_t total, int64_t width, int block,
           unsigned seed) {
  const int64_t blocks = (total + block - 1) / block;
  Paged out;
  for (int64_t b = 0; b < blocks; ++b) out.table.push_back(static_cast<int32_t>(b + 1));
  std::mt19937 rng(seed);
  std::shuffle(out.table.begin(), out.table.end(), rng);
  out.k.assign(static_cast<size_t>((blocks + 1) * block * width), NAN);
  out.v = out.k;
  for (int64_t r = 0; r < total; ++r) {
    const int64_t row = out.table[static_cast<size_t>(r / block)] * int64_t{block} + r % block;
    std::copy_n(k.begin() + r * width, width, out.k.begin() + row * width);
    std::copy_n(v.begin() + r * width, width, out.v.begin() + row * width);
  }
  return out;
}

TEST_P(OpsTest, AttentionGqaWindowSoftcapThroughBlockTables) {
  for (int block : {16, 3}) {
    for (int window : {0, 5}) {
      for (float softcap : {0.0f, 2.0f}) {
        AttentionParams p{6, 2, 16, 0.3f, softcap, window};
        const int64_t start = 9, n = 7, total = start + n, qs = 6 * 16, kvs = 2 * 16;
        auto q = random_vec(static_cast<size_t>(n * qs), 4);
        auto k = random_vec(static_cast<size_t>(total * kvs), 5);
        auto v = random_vec(static_cast<size_t>(total * kvs), 6);
        Paged paged = page(k, v, total, kvs, block, 7);
        std::vector<float> out(static_cast<size_t>(n * qs), NAN);
        std::vector<int32_t> positions;
        for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(start + t));
        const KvPages pages{paged.k.data(), paged.v.data(), kvs, block, paged.table.data(), 0, {}};
        backend_->attention(q.data(), n, qs, pages, positions.data(), total, p, out.data(), qs);
        std::vector<double> ref;
        reference_attention(q, k, v, n, start, p, ref);
        EXPECT_LE(rel_err(out, ref), 1e-5) << "block " << block << " window " << window << " softcap " << softcap;
      }
    }
  }
}

// One decode query per sequence, each through its own table row (table_stride > 0).
TEST_P(OpsTest, AttentionOneQueryPerSequence) {
  AttentionParams p{4, 2, 16, 0.25f, 0.0f, 0};
  const int64_t qs = 4 * 16, kvs = 2 * 16, block = 4, stride = 8;
  const std::vector<int64_t> lengths = {1, 13, 30};
  std::vector<float> pool_k, pool_v, q_all, out(static_cast<size_t>(3 * qs), NAN);
  std::vector<int32_t> tables(static_cast<size_t>(3 * stride), 0), positions;
  std::vector<std::vector<double>> refs;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t total = lengths[s];
    auto q = random_vec(static_cast<size_t>(qs), 20 + static_cast<unsigned>(s));
    auto k = random_vec(static_cast<size_t>(total * kvs), 30 + static_cast<unsigned>(s));
    auto v = random_vec(static_cast<size_t>(total * kvs), 40 + static_cast<unsigned>(s));
    Paged paged = page(k, v, total, kvs, block, 50 + static_cast<unsigned>(s));
    const auto base = static_cast<int32_t>(pool_k.size() / static_cast<size_t>(block * kvs));  // this sequence's blocks follow
    pool_k.insert(pool_k.end(), paged.k.begin(), paged.k.end());
    pool_v.insert(pool_v.end(), paged.v.begin(), paged.v.end());
    for (size_t b = 0; b < paged.table.size(); ++b) tables[s * stride + b] = base + paged.table[b];
    q_all.insert(q_all.end(), q.begin(), q.end());
    positions.push_back(static_cast<int32_t>(total - 1));
    std::vector<double> ref;
    reference_attention(q, k, v, 1, total - 1, p, ref);
    refs.push_back(ref);
  }
  const KvPages pages{pool_k.data(), pool_v.data(), kvs, static_cast<int>(block), tables.data(), stride, {}};
  backend_->attention(q_all.data(), 3, qs, pages, positions.data(), stride * block, p, out.data(), qs);
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<float> row(out.begin() + static_cast<int64_t>(s) * qs, out.begin() + static_cast<int64_t>(s + 1) * qs);
    EXPECT_LE(rel_err(row, refs[s]), 1e-5) << "sequence " << s;
  }
}

// --- quantized KV rows (tensor/kv_codec.h) ---

// The codecs the --kv-quant policies give a full-attention layer with heads of hd.
std::vector<std::pair<std::string, KvCodec>> quantized_codecs(int hd) {
  std::vector<std::pair<std::string, KvCodec>> out;
  for (const char* name : {"8", "4", "fp8", "turbo", "turbo:k4v2"})
    out.emplace_back(name, parse_kv_quant(name).codec_for(0, KvLayer::Kind::kFull, hd, DType::kF32));
  return out;
}

// One head of rotated values back to the channel basis in double: per block of `block`
// channels D · H · u / √block, H[i][j] = (−1)^popcount(i & j), D the codec's sign flips.
void unrotate_reference(float* u, int n, int block) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n; ++i) {
    const int first = i / block * block;
    for (int j = first; j < first + block; ++j)
      out[static_cast<size_t>(i)] += (std::popcount(static_cast<unsigned>((i - first) & (j - first))) % 2 ? -1.0 : 1.0) * u[j];
    out[static_cast<size_t>(i)] *= (kv_rotation_flips(i) ? -1.0 : 1.0) / std::sqrt(static_cast<double>(block));
  }
  for (int i = 0; i < n; ++i) u[i] = static_cast<float>(out[static_cast<size_t>(i)]);
}

// Rows [total, width] encoded into a shuffled pool of blocks, and the values those rows hold
// (decoded; values un-rotated by the double reference), for the reference attention.
struct QuantPaged {
  std::vector<uint8_t> k, v;
  std::vector<int32_t> table;
  std::vector<float> k_held, v_held;
};
QuantPaged page_quantized(const KvCodec& c, const std::vector<float>& k, const std::vector<float>& v, int64_t total,
                          int64_t width, int hd, int block, unsigned seed) {
  const int64_t blocks = (total + block - 1) / block;
  QuantPaged out;
  for (int64_t b = 0; b < blocks; ++b) out.table.push_back(static_cast<int32_t>(b + 1));
  std::mt19937 rng(seed);
  std::shuffle(out.table.begin(), out.table.end(), rng);
  const size_t kb = c.key.row_bytes(width), vb = c.value.row_bytes(width);
  out.k.assign(static_cast<size_t>((blocks + 1) * block) * kb, 0xff);  // poison: rows never written stay unread
  out.v.assign(static_cast<size_t>((blocks + 1) * block) * vb, 0xff);
  out.k_held.resize(k.size());
  out.v_held.resize(v.size());
  for (int64_t r = 0; r < total; ++r) {
    const int64_t row = out.table[static_cast<size_t>(r / block)] * int64_t{block} + r % block;
    uint8_t* kr = out.k.data() + static_cast<size_t>(row) * kb;
    uint8_t* vr = out.v.data() + static_cast<size_t>(row) * vb;
    kv_encode_row(c.key, k.data() + r * width, width, hd, kr);
    kv_encode_row(c.value, v.data() + r * width, width, hd, vr);
    kv_decode_span(c.key, kr, width, 0, width, out.k_held.data() + r * width);
    kv_decode_span(c.value, vr, width, 0, width, out.v_held.data() + r * width);
    if (c.value.rotation > 0)
      for (int64_t h = 0; h * hd < width; ++h) unrotate_reference(out.v_held.data() + r * width + h * hd, hd, c.value.rotation);
  }
  return out;
}

// Attention over quantized rows equals attention over the values they hold (double
// reference), for a prompt chunk and for one query per sequence; the chunk's queries get the
// same bits as each alone.
TEST_P(OpsTest, AttentionReadsQuantizedRows) {
  for (const int hd : {64, 48}) {  // 48: groups of 16, rotation blocks of 16
    for (const auto& [name, codec] : quantized_codecs(hd)) {
      for (int window : {0, 6}) {
        AttentionParams p{4, 2, hd, 0.125f, 0.0f, window};
        const int64_t start = 11, n = 6, total = start + n, qs = 4 * hd, kvs = 2 * hd;
        const int block = 4;
        const auto q = random_vec(static_cast<size_t>(n * qs), 60);
        const auto k = random_vec(static_cast<size_t>(total * kvs), 61);
        const auto v = random_vec(static_cast<size_t>(total * kvs), 62);
        QuantPaged paged = page_quantized(codec, k, v, total, kvs, hd, block, 63);
        std::vector<int32_t> positions;
        for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(start + t));
        const KvPages chunk{paged.k.data(), paged.v.data(), kvs, block, paged.table.data(), 0, codec};
        std::vector<float> out(static_cast<size_t>(n * qs), NAN);
        backend_->attention(q.data(), n, qs, chunk, positions.data(), total, p, out.data(), qs);
        std::vector<double> ref;
        reference_attention(q, paged.k_held, paged.v_held, n, start, p, ref);
        EXPECT_LE(rel_err(out, ref), 2e-5) << name << " window " << window;
        // Each query alone, through a table row of its own (the decode path).
        const auto table_stride = static_cast<int64_t>(paged.table.size());
        std::vector<int32_t> tables;
        for (int64_t t = 0; t < n; ++t) tables.insert(tables.end(), paged.table.begin(), paged.table.end());
        const KvPages rows{paged.k.data(), paged.v.data(), kvs, block, tables.data(), table_stride, codec};
        std::vector<float> alone(out.size(), NAN);
        backend_->attention(q.data(), n, qs, rows, positions.data(), total, p, alone.data(), qs);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(alone[i]), std::bit_cast<uint32_t>(out[i])) << name << " " << i;
      }
    }
  }
}

// qkv_rope_store into quantized rows stores exactly the codec's encoding of the rows it
// stores plain.
TEST_P(OpsTest, QkvRopeStoreEncodesRowsAsTheCodec) {
  const int64_t n = 5, heads = 4, kv_heads = 2, hd = 64, width = (heads + 2 * kv_heads) * hd, kvs = kv_heads * hd;
  const auto x = random_vec(static_cast<size_t>(n * width), 70);
  std::vector<float> inv(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / hd);
  const std::vector<int32_t> pos = {0, 1, 2, 9, 30}, table = {0};
  const QkvLayout layout{static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(hd)};
  std::vector<float> q(static_cast<size_t>(n * heads * hd)), k_plain(static_cast<size_t>(32 * kvs)), v_plain = k_plain;
  backend_->qkv_rope_store(x.data(), n, width, layout, pos.data(), RopeParams{inv.data(), static_cast<int>(hd), 1.0f},
                           q.data(), KvPages{k_plain.data(), v_plain.data(), kvs, 32, table.data(), 0, {}});
  for (const auto& [name, codec] : quantized_codecs(static_cast<int>(hd))) {
    std::vector<uint8_t> k(32 * codec.key.row_bytes(kvs)), v(32 * codec.value.row_bytes(kvs));
    std::vector<float> q2(q.size());
    backend_->qkv_rope_store(x.data(), n, width, layout, pos.data(), RopeParams{inv.data(), static_cast<int>(hd), 1.0f},
                             q2.data(), KvPages{k.data(), v.data(), kvs, 32, table.data(), 0, codec});
    EXPECT_EQ(q2, q) << name;
    for (int32_t row : pos) {
      std::vector<uint8_t> want_k(codec.key.row_bytes(kvs)), want_v(codec.value.row_bytes(kvs));
      kv_encode_row(codec.key, k_plain.data() + row * kvs, kvs, static_cast<int>(hd), want_k.data());
      kv_encode_row(codec.value, v_plain.data() + row * kvs, kvs, static_cast<int>(hd), want_v.data());
      EXPECT_TRUE(std::equal(want_k.begin(), want_k.end(), k.begin() + row * static_cast<int64_t>(want_k.size()))) << name << " row " << row;
      EXPECT_TRUE(std::equal(want_v.begin(), want_v.end(), v.begin() + row * static_cast<int64_t>(want_v.size()))) << name << " row " << row;
    }
  }
}

// project_gated: act(x·gateᵀ + b) * (x·upᵀ) against double products, every activation,
// with and without the input norm.
TEST_P(OpsTest, GatedProjections) {
  const int64_t n = 4, k = 24, width = 37;
  const auto x = random_vec(static_cast<size_t>(n * k), 9, 1.5f);
  Bf16Weight gw({width, k}, 7), uw({width, k}, 8), gb({width}, 10), nw({k}, 11);
  const Linear gate{gw.tensor, gb.tensor}, up{uw.tensor, {}};
  for (const bool normed : {false, true})
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kGelu}) {
      std::vector<double> xs(x.begin(), x.end());
      if (normed)
        for (int64_t t = 0; t < n; ++t) {
          double ss = 0;
          for (int64_t i = 0; i < k; ++i) ss += xs[static_cast<size_t>(t * k + i)] * xs[static_cast<size_t>(t * k + i)];
          const double inv = 1.0 / std::sqrt(ss / k + 1e-6);
          for (int64_t i = 0; i < k; ++i) xs[static_cast<size_t>(t * k + i)] *= inv * nw.values[static_cast<size_t>(i)];
        }
      std::vector<float> g(static_cast<size_t>(n * width), NAN), u = g, out = g;
      const InputNorm norm{&nw.tensor, 1e-6f, false};
      backend_->project_gated(x.data(), n, k, normed ? &norm : nullptr, {&gate, g.data(), width}, {&up, u.data(), width},
                              act, out.data(), width);
      std::vector<double> ref(out.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < width; ++i) {
          double a = gb.values[static_cast<size_t>(i)], b = 0;
          for (int64_t j = 0; j < k; ++j) {
            a += xs[static_cast<size_t>(t * k + j)] * gw.values[static_cast<size_t>(i * k + j)];
            b += xs[static_cast<size_t>(t * k + j)] * uw.values[static_cast<size_t>(i * k + j)];
          }
          double act_a = 0;
          if (act == Activation::kSilu) act_a = a / (1 + std::exp(-a));
          if (act == Activation::kGeluTanh) act_a = 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
          if (act == Activation::kGelu) act_a = 0.5 * a * (1 + std::erf(a / std::sqrt(2.0)));
          ref[static_cast<size_t>(t * width + i)] = act_a * b;
        }
      EXPECT_LE(rel_err(out, ref), 1e-5) << static_cast<int>(act) << (normed ? " normed" : "");
    }
}

TEST_P(OpsTest, EmbedScalesRows) {
  Bf16Weight table({10, 24}, 9);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<float> out(4 * 24, NAN);
  backend_->embed(ids.data(), 4, Linear{table.tensor}, 2.0f, out.data());
  for (size_t t = 0; t < 4; ++t)
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(out[t * 24 + i], static_cast<float>(table.values[static_cast<size_t>(ids[t]) * 24 + i] * 2.0));
}

TEST_P(OpsTest, MixtureOfExperts) {
  const int64_t n = 6, hidden = 24, inter = 20;
  const int n_experts = 5;
  for (bool renormalize : {true, false}) {
    Bf16Weight router({n_experts, hidden}, 10);
    std::vector<Bf16Weight> gates, ups, downs;
    std::vector<ExpertWeights> experts;
    for (int e = 0; e < n_experts; ++e) {
      gates.emplace_back(std::vector<int64_t>{inter, hidden}, 100 + e);
      ups.emplace_back(std::vector<int64_t>{inter, hidden}, 200 + e);
      downs.emplace_back(std::vector<int64_t>{hidden, inter}, 300 + e);
    }
    for (int e = 0; e < n_experts; ++e)
      experts.push_back({Linear{gates[static_cast<size_t>(e)].tensor}, Linear{ups[static_cast<size_t>(e)].tensor},
                         Linear{downs[static_cast<size_t>(e)].tensor}});
    auto x = random_vec(static_cast<size_t>(n * hidden), 11);
    std::vector<float> out(static_cast<size_t>(n * hidden), NAN);
    backend_->moe(x.data(), n, hidden, Linear{router.tensor}, experts, MoeParams{2, renormalize, Activation::kSilu}, out.data());

    std::vector<double> ref(out.size(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> logit(n_experts);
      for (int e = 0; e < n_experts; ++e)
        for (int64_t i = 0; i < hidden; ++i) logit[static_cast<size_t>(e)] += router.values[static_cast<size_t>(e * hidden + i)] * x[static_cast<size_t>(t * hidden + i)];
      double mx = *std::max_element(logit.begin(), logit.end()), z = 0;
      std::vector<double> prob(n_experts);
      for (int e = 0; e < n_experts; ++e) z += prob[static_cast<size_t>(e)] = std::exp(logit[static_cast<size_t>(e)] - mx);
      for (auto& pr : prob) pr /= z;
      std::vector<int> order(n_experts);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[static_cast<size_t>(a)] > prob[static_cast<size_t>(b)]; });
      double top = prob[static_cast<size_t>(order[0])] + prob[static_cast<size_t>(order[1])];
      for (int r = 0; r < 2; ++r) {
        int e = order[static_cast<size_t>(r)];
        double weight = prob[static_cast<size_t>(e)] / (renormalize ? top : 1.0);
        std::vector<double> act(static_cast<size_t>(inter));
        for (int64_t j = 0; j < inter; ++j) {
          double gsum = 0, usum = 0;
          for (int64_t i = 0; i < hidden; ++i) {
            gsum += gates[static_cast<size_t>(e)].values[static_cast<size_t>(j * hidden + i)] * x[static_cast<size_t>(t * hidden + i)];
            usum += ups[static_cast<size_t>(e)].values[static_cast<size_t>(j * hidden + i)] * x[static_cast<size_t>(t * hidden + i)];
          }
          act[static_cast<size_t>(j)] = gsum / (1 + std::exp(-gsum)) * usum;
        }
        for (int64_t i = 0; i < hidden; ++i) {
          double y = 0;
          for (int64_t j = 0; j < inter; ++j) y += downs[static_cast<size_t>(e)].values[static_cast<size_t>(i * inter + j)] * act[static_cast<size_t>(j)];
          ref[static_cast<size_t>(t * hidden + i)] += weight * y;
        }
      }
    }
    EXPECT_LE(rel_err(out, ref), 1e-5) << "renormalize " << renormalize;
  }
}

TEST_P(OpsTest, SoftcapAndAdd) {
  auto x = random_vec(100, 12, 40.0f);
  auto y = random_vec(100, 13);
  auto orig = x;
  backend_->softcap(x.data(), 100, 30.0f);
  for (size_t i = 0; i < 100; ++i) EXPECT_NEAR(x[i], 30.0 * std::tanh(orig[i] / 30.0), 1e-4);
  orig = x;
  backend_->add(x.data(), y.data(), 100);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(x[i], orig[i] + y[i]);
}

INSTANTIATE_TEST_SUITE_P(Threads, OpsTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace kettle
