// Each CPU op against a naive double-precision reference on random inputs,
// with outputs poisoned (NaN) beforehand and 1 and 3 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/backend.h"

namespace kettle {
namespace {

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

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
  const KvPages pages{k.data(), v.data(), hd, 1024, table.data(), 0};
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
        const KvPages pages{paged.k.data(), paged.v.data(), kvs, block, paged.table.data(), 0};
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
  const KvPages pages{pool_k.data(), pool_v.data(), kvs, static_cast<int>(block), tables.data(), stride};
  backend_->attention(q_all.data(), 3, qs, pages, positions.data(), stride * block, p, out.data(), qs);
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<float> row(out.begin() + static_cast<int64_t>(s) * qs, out.begin() + static_cast<int64_t>(s + 1) * qs);
    EXPECT_LE(rel_err(row, refs[s]), 1e-5) << "sequence " << s;
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
