// FlashAttention, step by step — tests of step 1, the oracle.
// Forward: against an independent plain-loop fp64 implementation written here.
// Backward: against central finite differences of the scalar loss L = sum(dO * O).
// Score modifiers (bias, ALiBi, window, softcap; core/score_mod.h): the same two checks, with the modifiers
// written out again here, dBias among the gradients, and the properties that tie them to the plain problem.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "core/dropout.h"
#include "core/random.h"
#include "core/score_mod.h"
#include "harness/cli.h"
#include "harness/registry.h"
#include "step1_cpu_reference/reference.h"

namespace fa {
namespace {

// The ALiBi repository's get_slopes(n), transcribed: for a power of two, start = 2^(-2^-(log2(n) - 3)) and
// the slopes start^1 .. start^n; otherwise those of the power of two below, then every other of twice it.
std::vector<double> alibi_slopes_paper(int64_t n) {
  auto power_of_2 = [](int64_t k) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(double(k)) - 3)));
    std::vector<double> r;
    for (int64_t i = 0; i < k; ++i) r.push_back(start * std::pow(start, double(i)));
    return r;
  };
  const int64_t m = int64_t(1) << int64_t(std::floor(std::log2(double(n))));
  std::vector<double> r = power_of_2(m);
  if (m == n) return r;
  const std::vector<double> twice = power_of_2(2 * m);
  for (int64_t k = 0; k < n - m; ++k) r.push_back(twice[size_t(2 * k)]);
  return r;
}

// Plain loops, fp64, no Eigen: O and LSE of one problem, the score modifiers written out as the
// conventions define them (not through core/score_mod.h).
void loop_attention(const Problem& p, const Inputs& in, std::vector<double>& O, std::vector<double>& L) {
  const std::vector<double> slopes = alibi_slopes_paper(p.Hq);
  const DropoutParams dp = make_dropout(p.dropout, p.seed);
  O.assign(size_t(p.B * p.Hq * p.Nq * p.d), 0.0);
  L.assign(size_t(p.B * p.Hq * p.Nq), 0.0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t hk = h / p.group();
      for (int64_t i = 0; i < p.Nq; ++i) {
        std::vector<double> s(size_t(p.Nk), -std::numeric_limits<double>::infinity());
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.Nk; ++j) {
          const int64_t diag = p.input_pos + i;
          if (p.causal && j > diag) continue;
          if (p.window_left >= 0 && j < diag - p.window_left) continue;
          if (p.window_right >= 0 && j > diag + p.window_right) continue;
          double dot = 0;
          for (int64_t c = 0; c < p.d; ++c)
            dot += double(in.q.data[((b * p.Hq + h) * p.Nq + i) * p.d + c]) *
                   double(in.k.data[((b * p.Hkv + hk) * p.Nk + j) * p.d + c]);
          s[j] = double(p.scale) * dot;
          if (p.bias) {
            const int64_t bb = in.bias.shape[0] == 1 ? 0 : b, bh = in.bias.shape[1] == 1 ? 0 : h;
            s[j] += double(in.bias.data[((bb * in.bias.shape[1] + bh) * p.Nq + i) * p.Nk + j]);
          }
          if (p.alibi) {
            const double slope = in.alibi_slopes.empty() ? double(float(slopes[size_t(h)])) : double(in.alibi_slopes.data[size_t(h)]);
            s[j] -= slope * std::fabs(double(j - diag));
          }
          if (p.softcap > 0 && std::isfinite(s[j])) s[j] = double(p.softcap) * std::tanh(s[j] / double(p.softcap));
          m = std::max(m, s[j]);
        }
        const size_t li = size_t((b * p.Hq + h) * p.Nq + i);
        if (m == -std::numeric_limits<double>::infinity()) {
          L[li] = m;
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < p.Nk; ++j) l += std::exp(s[j] - m);
        L[li] = m + std::log(l);
        for (int64_t j = 0; j < p.Nk; ++j) {
          double w = std::exp(s[j] - m) / l;
          if (p.dropout > 0)
            w = dropout_keep(dp, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j)) ? w / (1.0 - p.dropout) : 0.0;
          for (int64_t c = 0; c < p.d; ++c)
            O[li * p.d + c] += w * double(in.v.data[((b * p.Hkv + hk) * p.Nk + j) * p.d + c]);
        }
      }
    }
}

struct Case {
  int64_t Nq, Nk, Hq, Hkv;
  bool causal;
  int64_t input_pos;  // INT64_MIN = default (Nk - Nq)
  float dropout;
};

Problem make_problem(const Case& c, bool backward) {
  Problem p;
  p.B = 2;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.d = 8;
  p.causal = c.causal;
  p.input_pos = c.input_pos == INT64_MIN ? c.Nk - c.Nq : c.input_pos;
  p.scale = 0.4f;
  p.dtype = DType::fp32;
  p.dropout = c.dropout;
  p.seed = 1234;
  p.backward = backward;
  p.validate();
  return p;
}

std::vector<Case> feature_cases() {
  std::vector<Case> cs;
  for (int64_t group : {1, 2, 4})
    for (bool causal : {false, true})
      for (int64_t pos : {INT64_MIN, int64_t(0), int64_t(3)})
        for (float drop : {0.0f, 0.3f}) {
          if (!causal && pos != INT64_MIN) continue;
          cs.push_back({5, 9, 4, 4 / group, causal, pos, drop});  // Nq != Nk
        }
  cs.push_back({7, 7, 2, 1, true, INT64_MIN, 0.0f});  // Nq == Nk, square causal
  cs.push_back({6, 4, 2, 2, true, INT64_MIN, 0.0f});  // Nq > Nk: default input_pos < 0, rows fully masked
  return cs;
}

class Step1Features : public ::testing::TestWithParam<Case> {};

TEST_P(Step1Features, ForwardMatchesPlainLoops) {
  const Problem p = make_problem(GetParam(), false);
  const Inputs in = random_inputs(p);
  const auto r = step1::attention<double>(p, in, false);
  std::vector<double> O, L;
  loop_attention(p, in, O, L);
  for (size_t k = 0; k < O.size(); ++k) ASSERT_NEAR(r.o.data[k], O[k], 1e-12) << "O element " << k;
  for (size_t k = 0; k < L.size(); ++k) {
    if (std::isinf(L[k])) {
      ASSERT_EQ(r.lse.data[k], L[k]) << "LSE element " << k;
    } else {
      ASSERT_NEAR(r.lse.data[k], L[k], 1e-12) << "LSE element " << k;
    }
  }
}

// L(Q, K, V) = sum(dO * O): its gradient is exactly what the backward returns.
double loss(const Problem& p, const Inputs& in) {
  const auto r = step1::attention<double>(p, in, false);
  double s = 0;
  for (size_t k = 0; k < r.o.size(); ++k) s += r.o.data[k] * double(in.dout.data[k]);
  return s;
}

// Central differences of loss() against an analytic gradient, at every `stride`-th element of x (one of
// in's tensors, perturbed in place and restored). Inputs are float; a step of 1e-2 keeps
// (L(x+h) - L(x-h)) / 2h accurate to ~1e-5 (O(h^2) truncation).
void expect_central_differences(const Problem& p, Inputs& in, Tensor& x, const TensorT<double>& grad,
                                const char* name, size_t stride) {
  ASSERT_EQ(grad.shape, x.shape) << name;
  const float h = 1e-2f;
  for (size_t k = 0; k < x.size(); k += stride) {
    const float x0 = x.data[k];
    x.data[k] = x0 + h;
    const double lp = loss(p, in);
    x.data[k] = x0 - h;
    const double lm = loss(p, in);
    x.data[k] = x0;
    const double fd = (lp - lm) / (2.0 * double(h));
    ASSERT_NEAR(grad.data[k], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << name << " element " << k;
  }
}

TEST_P(Step1Features, BackwardMatchesFiniteDifferences) {
  const Problem p = make_problem(GetParam(), true);
  Inputs in = random_inputs(p);
  const auto r = step1::attention<double>(p, in, true);
  expect_central_differences(p, in, in.q, r.dq, "dQ", 3);
  expect_central_differences(p, in, in.k, r.dk, "dK", 3);
  expect_central_differences(p, in, in.v, r.dv, "dV", 3);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string n = "Nq" + std::to_string(c.Nq) + "_Nk" + std::to_string(c.Nk) + "_G" + std::to_string(c.Hq / c.Hkv);
  if (c.causal) n += "_causal_pos" + (c.input_pos == INT64_MIN ? std::string("default") : std::to_string(c.input_pos));
  if (c.dropout > 0) n += "_dropout";
  return n;
}

INSTANTIATE_TEST_SUITE_P(AllFeatures, Step1Features, ::testing::ValuesIn(feature_cases()), case_name);

TEST(Step1, FullyMaskedRowGivesZeroOutputAndMinusInfLse) {
  Problem p = make_problem({4, 3, 1, 1, true, -2, 0.0f}, true);  // rows 0 and 1 see nothing
  const Inputs in = random_inputs(p);
  const auto r = step1::attention<double>(p, in, true);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r.lse.data[b * p.Nq + i], -std::numeric_limits<double>::infinity());
      for (int64_t c = 0; c < p.d; ++c) {
        EXPECT_EQ(r.o.data[(b * p.Nq + i) * p.d + c], 0.0);
        EXPECT_EQ(r.dq.data[(b * p.Nq + i) * p.d + c], 0.0);
      }
    }
  for (double x : r.o.data) EXPECT_FALSE(std::isnan(x));
}

TEST(Step1, LowPrecisionBaselineIsCloseButNotExact) {
  Problem p = make_problem({16, 16, 2, 2, false, INT64_MIN, 0.0f}, false);
  p.dtype = DType::bf16;
  const Inputs in = random_inputs(p);
  const auto ref = step1::attention<double>(p, in, false);
  const auto low = step1::attention<float>(p, in, false, DType::bf16);
  const ErrorStats e = compare(low.o, ref.o);
  EXPECT_GT(e.max_abs, 0.0);   // the roundings are really there
  EXPECT_LT(e.rel_l2, 2e-2);   // and of bf16's size (8 mantissa bits)
}

TEST(Step1, DropoutKeepsAboutOneMinusP) {
  const DropoutParams dp = make_dropout(0.25f, 42);
  int kept = 0;
  const int n = 200000;
  for (int j = 0; j < n; ++j) kept += dropout_keep(dp, 1, 2, uint32_t(j / 1000), uint32_t(j % 1000));
  EXPECT_NEAR(double(kept) / n, 0.75, 0.005);
}

// ---- score modifiers and masks (core/score_mod.h) ----------------------------------------------------

struct ModCase {
  std::string name;
  int64_t Nq, Nk, Hq, Hkv;
  bool causal;
  int64_t biasB, biasH;  // the bias's leading dims (1 = broadcast); 0, 0: no bias
  bool alibi;
  float softcap;
  int64_t wl, wr;  // window; -1, -1: none
  float dropout = 0.0f;
  int64_t input_pos = INT64_MIN;  // INT64_MIN = default (Nk - Nq)
};

Problem make_mod_problem(const ModCase& c, bool backward) {
  Problem p = make_problem({c.Nq, c.Nk, c.Hq, c.Hkv, c.causal, c.input_pos, c.dropout}, backward);
  p.bias = c.biasB > 0;
  p.alibi = c.alibi;
  p.softcap = c.softcap;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.validate();
  return p;
}

// Random inputs and, with a bias, a N(0, 1) bias of the case's shape (its own stream of the seed).
Inputs mod_inputs(const Problem& p, const ModCase& c) {
  Inputs in = random_inputs(p);
  if (p.bias) in.bias = random_tensor({c.biasB, c.biasH, p.Nq, p.Nk}, p.seed, 9, 0.0f, DType::fp32);
  return in;
}

std::vector<ModCase> mod_cases() {
  return {
      // name                      Nq Nk Hq Hkv causal bB bH alibi softcap  wl  wr
      {"bias_full",                 5, 9, 4, 2, false, 2, 4, false, 0.0f, -1, -1},
      {"bias_over_batch",           5, 9, 4, 2, false, 1, 4, false, 0.0f, -1, -1},
      {"bias_over_heads",           5, 9, 4, 2, true, 2, 1, false, 0.0f, -1, -1},
      {"bias_over_both",            5, 9, 4, 4, false, 1, 1, false, 0.0f, -1, -1},
      {"alibi_gqa",                 5, 9, 6, 2, false, 0, 0, true, 0.0f, -1, -1},
      {"alibi_gqa_causal",          5, 9, 4, 1, true, 0, 0, true, 0.0f, -1, -1},
      {"window_left_causal",        7, 9, 2, 1, true, 0, 0, false, 0.0f, 2, -1},
      {"window_both",               7, 9, 2, 2, false, 0, 0, false, 0.0f, 1, 2},
      {"window_zero",               5, 9, 2, 2, false, 0, 0, false, 0.0f, 0, 0},
      {"window_right_only",         5, 9, 2, 2, false, 0, 0, false, 0.0f, -1, 1},
      {"softcap",                   5, 9, 4, 2, false, 0, 0, false, 0.7f, -1, -1},
      {"softcap_causal",            5, 9, 2, 2, true, 0, 0, false, 1.5f, -1, -1},
      {"all_together",              6, 9, 4, 2, true, 1, 4, true, 1.0f, 3, -1, 0.3f},
      {"window_rows_fully_masked",  4, 5, 2, 2, false, 2, 1, true, 0.8f, 1, 0, 0.0f, -2},
  };
}

class Step1ScoreMods : public ::testing::TestWithParam<ModCase> {};

TEST_P(Step1ScoreMods, ForwardMatchesPlainLoops) {
  const Problem p = make_mod_problem(GetParam(), false);
  const Inputs in = mod_inputs(p, GetParam());
  const auto r = step1::attention<double>(p, in, false);
  std::vector<double> O, L;
  loop_attention(p, in, O, L);
  for (size_t k = 0; k < O.size(); ++k) ASSERT_NEAR(r.o.data[k], O[k], 1e-12) << "O element " << k;
  for (size_t k = 0; k < L.size(); ++k) {
    if (std::isinf(L[k])) {
      ASSERT_EQ(r.lse.data[k], L[k]) << "LSE element " << k;
    } else {
      ASSERT_NEAR(r.lse.data[k], L[k], 1e-12) << "LSE element " << k;
    }
  }
}

// dQ, dK, dV and dBias against central differences of L = sum(dO * O), in fp64.
TEST_P(Step1ScoreMods, BackwardMatchesFiniteDifferences) {
  const Problem p = make_mod_problem(GetParam(), true);
  Inputs in = mod_inputs(p, GetParam());
  const auto r = step1::attention<double>(p, in, true);
  for (const auto* t : {&r.dq, &r.dk, &r.dv, &r.dbias})
    for (double x : t->data) ASSERT_FALSE(std::isnan(x));
  expect_central_differences(p, in, in.q, r.dq, "dQ", 2);
  expect_central_differences(p, in, in.k, r.dk, "dK", 2);
  expect_central_differences(p, in, in.v, r.dv, "dV", 2);
  if (p.bias) {
    expect_central_differences(p, in, in.bias, r.dbias, "dBias", 2);
  } else {
    EXPECT_TRUE(r.dbias.empty());
  }
}

// The float path (the tolerance rule's baseline) computes the same modifiers: close to fp64 in fp32.
TEST_P(Step1ScoreMods, FloatPathAgreesWithFp64) {
  const Problem p = make_mod_problem(GetParam(), true);
  const Inputs in = mod_inputs(p, GetParam());
  const auto ref = step1::attention<double>(p, in, true);
  const auto f = step1::attention<float>(p, in, true);
  for (const auto& [got, want] : {std::pair{&f.o, &ref.o}, {&f.dq, &ref.dq}, {&f.dk, &ref.dk}, {&f.dbias, &ref.dbias}})
    for (size_t k = 0; k < want->size(); ++k) ASSERT_NEAR(got->data[k], want->data[k], 1e-4) << k;
}

INSTANTIATE_TEST_SUITE_P(Modifiers, Step1ScoreMods, ::testing::ValuesIn(mod_cases()),
                         [](const ::testing::TestParamInfo<ModCase>& info) { return info.param.name; });

TEST(Step1ScoreMod, AlibiSlopesAreTheStandardSeries) {
  for (int64_t n : {1, 2, 3, 4, 6, 8, 12, 16, 20, 32, 40}) {
    const std::vector<double> want = alibi_slopes_paper(n);
    for (int64_t h = 0; h < n; ++h) EXPECT_FLOAT_EQ(alibi_slope(h, n), float(want[size_t(h)])) << n << " heads, head " << h;
  }
  // The paper's 8 heads: 1/2, 1/4, ..., 1/256; 6 heads: those of 4, then 2^-1 and 2^-3.
  EXPECT_EQ(alibi_slope(0, 8), 0.5f);
  EXPECT_EQ(alibi_slope(7, 8), 1.0f / 256);
  EXPECT_EQ(alibi_slope(4, 6), 0.5f);
  EXPECT_EQ(alibi_slope(5, 6), 0.125f);
}

// ALiBi's sign: the nearer key (to the aligned diagonal) gets the larger score, on both sides.
TEST(Step1ScoreMod, AlibiPenalisesDistanceFromTheDiagonal) {
  ScoreMod m;
  m.alibi = true;
  m.Hq = 8;
  m.input_pos = 4;  // row 0 sits at key 4
  EXPECT_EQ(modify<double>(m, 0.0, 0.0, 0, 0, 4), 0.0);
  EXPECT_EQ(modify<double>(m, 0.0, 0.0, 0, 0, 2), -1.0);  // slope 1/2, 2 keys before
  EXPECT_EQ(modify<double>(m, 0.0, 0.0, 0, 0, 6), -1.0);  // and 2 keys after
}

// Slopes given as an input (--alibi-slopes): the standard ones give the same bits as none; others, one per
// query head (GQA), match the plain loops and the finite differences.
TEST(Step1ScoreMod, AlibiSlopesFromAnInput) {
  ModCase c{"", 5, 9, 4, 2, true, 0, 0, true, 0.0f, -1, -1};
  const Problem p = make_mod_problem(c, true);
  Inputs in = mod_inputs(p, c);
  const auto standard = step1::attention<double>(p, in, true);
  in.alibi_slopes = Tensor({p.Hq});
  for (int64_t h = 0; h < p.Hq; ++h) in.alibi_slopes.data[size_t(h)] = alibi_slope(h, p.Hq);
  const auto given = step1::attention<double>(p, in, true);
  EXPECT_EQ(standard.o.data, given.o.data);
  EXPECT_EQ(standard.dq.data, given.dq.data);
  in.alibi_slopes.data = {0.9f, 0.05f, 0.3f, 0.0f};
  const auto r = step1::attention<double>(p, in, true);
  std::vector<double> O, L;
  loop_attention(p, in, O, L);
  for (size_t k = 0; k < O.size(); ++k) ASSERT_NEAR(r.o.data[k], O[k], 1e-12) << "O element " << k;
  for (size_t k = 0; k < L.size(); ++k) ASSERT_NEAR(r.lse.data[k], L[k], 1e-12) << "LSE element " << k;
  const float h = 1e-2f;
  for (size_t k = 0; k < in.k.size(); k += 3) {
    const float x0 = in.k.data[k];
    in.k.data[k] = x0 + h;
    const double lp = loss(p, in);
    in.k.data[k] = x0 - h;
    const double lm = loss(p, in);
    in.k.data[k] = x0;
    const double fd = (lp - lm) / (2.0 * double(h));
    ASSERT_NEAR(r.dk.data[k], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "dK element " << k;
  }
}

TEST(Step1ScoreMod, NoWindowIsTheSameAsAnUnboundedOne) {
  ModCase c{"", 5, 9, 2, 2, true, 0, 0, false, 0.0f, -1, -1};
  Problem p = make_mod_problem(c, true);
  const Inputs in = mod_inputs(p, c);
  const auto a = step1::attention<double>(p, in, true);
  // A window wider than the problem on both sides: every causal key stays visible.
  p.window_left = 100;
  p.window_right = 100;
  const auto b = step1::attention<double>(p, in, true);
  EXPECT_EQ(a.o.data, b.o.data);
  EXPECT_EQ(a.lse.data, b.lse.data);
  EXPECT_EQ(a.dq.data, b.dq.data);
  EXPECT_EQ(a.dk.data, b.dk.data);
}

TEST(Step1ScoreMod, LargeSoftcapIsNoSoftcap) {
  ModCase c{"", 5, 9, 4, 2, false, 0, 0, false, 0.0f, -1, -1};
  Problem p = make_mod_problem(c, true);
  const Inputs in = mod_inputs(p, c);
  const auto a = step1::attention<double>(p, in, true);
  p.softcap = 1e5f;
  const auto b = step1::attention<double>(p, in, true);
  for (const auto& [x, y] : {std::pair{&a.o, &b.o}, {&a.lse, &b.lse}, {&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
    for (size_t k = 0; k < x->size(); ++k) ASSERT_NEAR(x->data[k], y->data[k], 1e-8) << k;
}

// A bias of -inf on key j0 (every row, head and batch) is the problem without that key: the same O and LSE,
// the same dQ and dK/dV of the other keys, zero dK/dV for j0 and zero dBias on its column; also with softcap.
TEST(Step1ScoreMod, MinusInfBiasMasksTheKey) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const float cap : {0.0f, 0.9f}) {
    ModCase c{"", 5, 9, 4, 2, false, 1, 1, false, cap, -1, -1};
    const Problem p = make_mod_problem(c, true);
    Inputs in = mod_inputs(p, c);
    const int64_t j0 = 3;
    for (int64_t i = 0; i < p.Nq; ++i)
      for (int64_t j = 0; j < p.Nk; ++j) in.bias.data[size_t(i * p.Nk + j)] = j == j0 ? -float(inf) : 0.0f;
    const auto r = step1::attention<double>(p, in, true);

    ModCase c2 = c;
    c2.Nk = c.Nk - 1;
    c2.biasB = c2.biasH = 0;
    Problem q = make_mod_problem(c2, true);
    q.input_pos = p.input_pos;
    Inputs in2 = in;
    in2.bias = Tensor();
    in2.k = Tensor({p.B, p.Hkv, q.Nk, p.d});
    in2.v = Tensor({p.B, p.Hkv, q.Nk, p.d});
    for (int64_t bh = 0; bh < p.B * p.Hkv; ++bh)
      for (int64_t j = 0, jj = 0; j < p.Nk; ++j) {
        if (j == j0) continue;
        for (int64_t e = 0; e < p.d; ++e) {
          in2.k.data[size_t((bh * q.Nk + jj) * p.d + e)] = in.k.data[size_t((bh * p.Nk + j) * p.d + e)];
          in2.v.data[size_t((bh * q.Nk + jj) * p.d + e)] = in.v.data[size_t((bh * p.Nk + j) * p.d + e)];
        }
        ++jj;
      }
    const auto w = step1::attention<double>(q, in2, true);
    for (size_t k = 0; k < r.o.size(); ++k) ASSERT_NEAR(r.o.data[k], w.o.data[k], 1e-12);
    for (size_t k = 0; k < r.lse.size(); ++k) ASSERT_NEAR(r.lse.data[k], w.lse.data[k], 1e-12);
    for (size_t k = 0; k < r.dq.size(); ++k) ASSERT_NEAR(r.dq.data[k], w.dq.data[k], 1e-12);
    for (int64_t bh = 0; bh < p.B * p.Hkv; ++bh)
      for (int64_t j = 0, jj = 0; j < p.Nk; ++j)
        for (int64_t e = 0; e < p.d; ++e) {
          const size_t k = size_t((bh * p.Nk + j) * p.d + e);
          const double want_k = j == j0 ? 0.0 : w.dk.data[size_t((bh * q.Nk + jj) * p.d + e)];
          const double want_v = j == j0 ? 0.0 : w.dv.data[size_t((bh * q.Nk + jj) * p.d + e)];
          ASSERT_NEAR(r.dk.data[k], want_k, 1e-12);
          ASSERT_NEAR(r.dv.data[k], want_v, 1e-12);
          if (e == p.d - 1 && j != j0) ++jj;
        }
    for (int64_t i = 0; i < p.Nq; ++i) EXPECT_EQ(r.dbias.data[size_t(i * p.Nk + j0)], 0.0);
  }
}

// A row whose every key is -inf (by the bias) is fully masked: O = 0, LSE = -inf, no NaN, softcap or not.
TEST(Step1ScoreMod, MinusInfBiasRowIsFullyMasked) {
  ModCase c{"", 4, 6, 2, 2, false, 1, 1, true, 0.5f, -1, -1};
  const Problem p = make_mod_problem(c, true);
  Inputs in = mod_inputs(p, c);
  for (int64_t j = 0; j < p.Nk; ++j) in.bias.data[size_t(1 * p.Nk + j)] = -std::numeric_limits<float>::infinity();
  const auto r = step1::attention<double>(p, in, true);
  for (int64_t bh = 0; bh < p.B * p.Hq; ++bh) {
    EXPECT_EQ(r.lse.data[size_t(bh * p.Nq + 1)], -std::numeric_limits<double>::infinity());
    for (int64_t e = 0; e < p.d; ++e) EXPECT_EQ(r.o.data[size_t((bh * p.Nq + 1) * p.d + e)], 0.0);
  }
  for (const auto* t : {&r.o, &r.dq, &r.dk, &r.dv, &r.dbias})
    for (double x : t->data) ASSERT_FALSE(std::isnan(x));
}

// FLOPs with a window: 4 * d per visible (i, j) pair, counted by brute force here; without one, unchanged.
TEST(Step1ScoreMod, WindowFlopsCountVisiblePairs) {
  for (const auto& [causal, wl, wr] : {std::tuple{false, 2, 1}, {true, 3, -1}, {false, -1, 0}, {true, 0, 0}}) {
    ModCase c{"", 6, 11, 2, 2, causal, 0, 0, false, 0.0f, wl, wr};
    const Problem p = make_mod_problem(c, false);
    const ScoreMod m = score_mod_of(p);
    double pairs = 0;
    for (int64_t i = 0; i < p.Nq; ++i)
      for (int64_t j = 0; j < p.Nk; ++j) pairs += visible(m, i, j);
    EXPECT_EQ(p.flops_forward(), 4.0 * double(p.B * p.Hq * p.d) * pairs) << causal << " " << wl << "," << wr;
  }
  ModCase c{"", 6, 11, 2, 2, true, 0, 0, false, 0.0f, -1, -1};
  const Problem p = make_mod_problem(c, false);
  EXPECT_EQ(p.flops_forward(), 4.0 * double(p.B * p.Hq * p.Nq * p.Nk * p.d) / 2);
}

TEST(Step1ScoreMod, BadValuesAreRefusedInOneSentence) {
  Problem p;
  p.softcap = -1.0f;
  EXPECT_THROW(p.validate(), std::invalid_argument);
  p.softcap = std::numeric_limits<float>::infinity();
  EXPECT_THROW(p.validate(), std::invalid_argument);
  p.softcap = 0.0f;
  p.window_left = -2;
  EXPECT_THROW(p.validate(), std::invalid_argument);
  p.window_left = 0;
  p.window_right = 3;
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace fa
