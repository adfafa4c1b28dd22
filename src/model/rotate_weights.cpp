// Random Hadamard rotations (Sylvester and Paley factors) and their folding into
// a checkpoint's weights for `kettle convert --rotate-weights`.
#include "model/rotate_weights.h"

#include <cmath>
#include <random>
#include <set>

#include "model/weights.h"
#include "tensor/hadamard.h"
#include "util/error.h"

namespace kettle {
namespace {

bool is_prime(int q) {
  if (q < 2) return false;
  for (int d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return true;
}

// χ(x) over GF(q): 0, 1 for a nonzero square, −1 otherwise.
std::vector<int> quadratic_character(int q) {
  std::vector<int> chi(static_cast<size_t>(q), -1);
  chi[0] = 0;
  for (int i = 1; i < q; ++i) chi[static_cast<size_t>(i * i % q)] = 1;
  return chi;
}

// [[0, 1ᵀ], [±1, Jacobsthal]] of order q + 1: Paley's core (lower-left −1 for q ≡ 3 mod 4).
std::vector<int> paley_core(int q, int first_column) {
  const std::vector<int> chi = quadratic_character(q);
  const int n = q + 1;
  std::vector<int> c(static_cast<size_t>(n * n), 0);
  for (int j = 1; j < n; ++j) c[static_cast<size_t>(j)] = 1, c[static_cast<size_t>(j * n)] = first_column;
  for (int i = 1; i < n; ++i)
    for (int j = 1; j < n; ++j) c[static_cast<size_t>(i * n + j)] = chi[static_cast<size_t>(((j - i) % q + q) % q)];
  return c;
}

bool paley_one(int m) { return is_prime(m - 1) && (m - 1) % 4 == 3; }
bool paley_two(int m) { return m % 2 == 0 && is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1; }

// A Hadamard matrix of order m (paley_one or paley_two) by Paley's constructions with a prime q.
std::vector<int8_t> paley_hadamard(int m) {
  std::vector<int8_t> h;
  if (paley_one(m)) {  // Paley I: I + core
    const std::vector<int> c = paley_core(m - 1, -1);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) h.push_back(static_cast<int8_t>(c[static_cast<size_t>(i * m + j)] + (i == j ? 1 : 0)));
  } else {  // Paley II: the core's entries as 2 × 2 blocks
    const int n = m / 2;
    const std::vector<int> c = paley_core(n - 1, 1);
    h.assign(static_cast<size_t>(m * m), 0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const int v = c[static_cast<size_t>(i * n + j)];
        const int block[2][2] = {{v == 0 ? 1 : v, v == 0 ? -1 : v}, {v == 0 ? -1 : v, v == 0 ? -1 : -v}};
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) h[static_cast<size_t>((2 * i + a) * m + 2 * j + b)] = static_cast<int8_t>(block[a][b]);
      }
  }
  for (int i = 0; i < m; ++i)  // H · Hᵀ = m · I, or the construction is wrong
    for (int j = 0; j < m; ++j) {
      int dot = 0;
      for (int k = 0; k < m; ++k) dot += h[static_cast<size_t>(i * m + k)] * h[static_cast<size_t>(j * m + k)];
      if (dot != (i == j ? m : 0)) fail(ErrorCategory::kInternal, "Paley Hadamard matrix of order {} is not orthogonal", m);
    }
  return h;
}

// n = m · 2^k with m 1 or a Paley order (by the primes alone: nothing built); m = 0 when there is none.
std::pair<int, int64_t> hadamard_factors(int64_t n) {
  int k = 0;
  while (n > 0 && (n >> (k + 1)) << (k + 1) == n) ++k;
  for (; k >= 0; --k) {
    const int64_t m = n >> k;
    if (m == 1) return {1, n};
    if (m % 4 == 0 && m <= 4096 && (paley_one(static_cast<int>(m)) || paley_two(static_cast<int>(m))))
      return {static_cast<int>(m), n / m};
  }
  return {0, 0};
}

}  // namespace

bool RandomHadamard::possible(int64_t n) { return hadamard_factors(n).first != 0; }

RandomHadamard::RandomHadamard(int64_t n, uint64_t seed) : n_(n) {
  const auto [m, p] = hadamard_factors(n);
  if (m == 0)
    fail(ErrorCategory::kUnsupported, "--rotate-weights: no Hadamard matrix of order {} (the hidden size) is known here; "
         "orders 2^k times 1 or a Paley order (12, 20, 28, …) are", n);
  m_ = m;
  p_ = p;
  if (m > 1) h_m_ = paley_hadamard(m);
  std::mt19937_64 random(seed);
  for (int64_t i = 0; i < n; ++i) signs_.push_back((random() >> 63) != 0 ? -1.0f : 1.0f);
}

void RandomHadamard::apply(float* x) const {
  std::vector<double> t(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) t[i] = static_cast<double>(x[i]) * signs_[i];
  for (int a = 0; a < m_; ++a)  // Sylvester's factor: a Walsh–Hadamard transform of each length-p run
    walsh_hadamard(t.data() + a * p_, static_cast<int>(p_));
  const double scale = 1.0 / std::sqrt(static_cast<double>(n_));
  if (m_ == 1) {
    for (int64_t i = 0; i < n_; ++i) x[i] = static_cast<float>(t[i] * scale);
    return;
  }
  for (int64_t d = 0; d < p_; ++d)  // the Paley factor across runs: out[c, d] = Σ_a H_m[a, c] · t[a, d]
    for (int c = 0; c < m_; ++c) {
      double sum = 0.0;
      for (int a = 0; a < m_; ++a) sum += h_m_[static_cast<size_t>(a * m_ + c)] * t[static_cast<size_t>(a * p_ + d)];
      x[c * p_ + d] = static_cast<float>(sum * scale);
    }
}

namespace {

void refuse_unless_rotatable(const ModelSpec& s) {
  const auto refuse = [&](const char* why) {
    fail(ErrorCategory::kUnsupported, "--rotate-weights: {} models ({}) do not keep their function under a rotation of "
         "the residual stream", s.model_type, why);
  };
  if (s.norm_add_one) refuse("RMSNorm scaled by 1 + w");
  if (s.sandwich_norms) refuse("norms after attention and after the MLP");
  if (s.n_experts > 0) refuse("mixtures of experts: the router reads the residual too");
  if (s.hidden_output) refuse("embedding models: their output is the residual itself");
}

}  // namespace

WeightRotation::WeightRotation(const ModelSpec& spec, const WeightStore& store, uint64_t seed)
    : store_(store), rotation_(spec.hidden_size, seed) {
  refuse_unless_rotatable(spec);
  const ModelWeights w = bind_weights(spec, store);
  std::map<const void*, std::string> names;
  for (const std::string& name : store.names()) names[store.get_any(name).data] = name;
  std::set<std::string> bound;
  const auto name_of = [&](const Tensor& t) {
    auto it = names.find(t.data);
    if (it == names.end()) fail(ErrorCategory::kInternal, "--rotate-weights: a bound tensor is not in the store");
    bound.insert(it->second);
    return it->second;
  };
  const auto add = [&](const Tensor& t, Role role, const std::string& gamma = "") {
    if (t.empty()) return;
    const std::string name = name_of(t);
    roles_[name] = {role, name, gamma};
  };
  const auto add_linear = [&](const Linear& l, Role role, const std::string& gamma = "") {
    add(l.weight, role, gamma);
    if (role == Role::kWriter) add(l.bias, role);
    else if (!l.bias.empty()) name_of(l.bias);
  };
  for (const LayerWeights& l : w.layers) {
    const std::string attn_norm = name_of(l.attn_norm), ffn_norm = name_of(l.ffn_norm);
    add(l.attn_norm, Role::kNormToOnes);
    add(l.ffn_norm, Role::kNormToOnes);
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.qkv}) add_linear(*p, Role::kReader, attn_norm);
    for (const Linear* p : {&l.gate, &l.up, &l.gate_up}) add_linear(*p, Role::kReader, ffn_norm);
    for (const Linear* p : {&l.o, &l.down}) add_linear(*p, Role::kWriter);
    for (const Tensor* t : {&l.q_norm, &l.k_norm})
      if (!t->empty()) name_of(*t);
  }
  const std::string embed = name_of(w.embed.weight), final_norm = name_of(w.final_norm);
  add(w.final_norm, Role::kNormToOnes);
  if (w.lm_head.weight.data == w.embed.weight.data) {  // tied: the head becomes a tensor of its own
    unties_ = true;
    if (store.contains("lm_head.weight")) bound.insert("lm_head.weight");  // a stored copy the tie ignored: replaced
    else added_.push_back("lm_head.weight");
    roles_["lm_head.weight"] = {Role::kReader, embed, final_norm};
  } else {
    add_linear(w.lm_head, Role::kReader, final_norm);
  }
  add(w.embed.weight, Role::kEmbedding);
  for (const std::string& name : store.names())
    if (bound.count(name) == 0 && name.find("inv_freq") == std::string::npos)
      fail(ErrorCategory::kUnsupported, "--rotate-weights: tensor '{}' is not part of the decoder kettle rotates", name);
}

std::vector<int64_t> WeightRotation::shape(const std::string& name) const {
  return store_.get_any(roles_.at(name).source).shape;
}

DType WeightRotation::source_dtype(const std::string& name) const {
  return store_.get_any(roles_.at(name).source).dtype;
}

std::vector<float> WeightRotation::values(const std::string& name, ThreadPool& pool) const {
  const Change& c = roles_.at(name);
  const Tensor t = store_.get(c.source);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = c.role == Role::kNormToOnes ? 1.0f : dtype_value(t.data, t.dtype, i);
  if (c.role == Role::kNormToOnes) return out;
  const int64_t n = rotation_.size();
  if (c.role == Role::kWriter && t.rank() == 2) {  // Qᵀ · W: each column
    const int64_t cols = t.dim(1);
    pool.parallel_for(cols, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> column(static_cast<size_t>(n));
      for (int64_t j = begin; j < end; ++j) {
        for (int64_t i = 0; i < n; ++i) column[i] = out[i * cols + j];
        rotation_.apply(column.data());
        for (int64_t i = 0; i < n; ++i) out[i * cols + j] = column[i];
      }
    });
    return out;
  }
  std::vector<float> gamma;
  if (!c.gamma.empty()) {
    const Tensor g = store_.get(c.gamma);
    for (int64_t i = 0; i < n; ++i) gamma.push_back(dtype_value(g.data, g.dtype, i));
  }
  const int64_t rows = t.numel() / n;  // a reader's or the embedding's rows, or a writer's bias
  pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = out.data() + r * n;
      if (!gamma.empty())
        for (int64_t i = 0; i < n; ++i) row[i] *= gamma[i];
      rotation_.apply(row);
    }
  });
  return out;
}

}  // namespace kettle
