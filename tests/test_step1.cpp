// FlashAttention, step by step — tests of step 1, the oracle.
// Forward: against an independent plain-loop fp64 implementation written here.
// Backward: against central finite differences of the scalar loss L = sum(dO * O).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dropout.h"
#include "harness/cli.h"
#include "harness/registry.h"
#include "step1_cpu_reference/reference.h"

namespace fa {
namespace {

// Plain loops, fp64, no Eigen: O and LSE of one problem.
void loop_attention(const Problem& p, const Inputs& in, std::vector<double>& O, std::vector<double>& L) {
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
          if (p.causal && j > p.input_pos + i) continue;
          double dot = 0;
          for (int64_t c = 0; c < p.d; ++c)
            dot += double(in.q.data[((b * p.Hq + h) * p.Nq + i) * p.d + c]) *
                   double(in.k.data[((b * p.Hkv + hk) * p.Nk + j) * p.d + c]);
          s[j] = double(p.scale) * dot;
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

TEST_P(Step1Features, BackwardMatchesFiniteDifferences) {
  const Problem p = make_problem(GetParam(), true);
  Inputs in = random_inputs(p);
  const auto r = step1::attention<double>(p, in, true);
  // Inputs are float; a step of 1e-2 keeps (L(x+h) - L(x-h)) / 2h accurate to ~1e-5 (O(h^2) truncation).
  const float h = 1e-2f;
  auto fd_check = [&](Tensor& x, const TensorT<double>& grad, const char* name) {
    for (size_t k = 0; k < x.size(); k += 3) {
      const float x0 = x.data[k];
      x.data[k] = x0 + h;
      const double lp = loss(p, in);
      x.data[k] = x0 - h;
      const double lm = loss(p, in);
      x.data[k] = x0;
      const double fd = (lp - lm) / (2.0 * double(h));
      ASSERT_NEAR(grad.data[k], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << name << " element " << k;
    }
  };
  fd_check(in.q, r.dq, "dQ");
  fd_check(in.k, r.dk, "dK");
  fd_check(in.v, r.dv, "dV");
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

}  // namespace
}  // namespace fa
