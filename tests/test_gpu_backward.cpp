// FlashAttention, step by step — the GPU backward grid: every GPU stage with a backward against step 1.
//
// Each case draws fresh random inputs (and dO), runs the stage's forward then its backward on outputs
// poisoned with NaN, and checks O, LSE, dQ, dK and dV against step 1 in fp64 under the FlashAttention rule
// (common/metrics.h): every element written, max error <= 2x that of naive attention in the same
// precision (+ a tiny epsilon). A second test runs the backward twice and wants the same bits (no atomics).
// Without a CUDA device every case is skipped with the reason (CI has no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#include "common/harness.h"

namespace fa {
namespace {

constexpr int64_t kDefaultPos = INT64_MIN;

struct BwdCase {
  int64_t B, Hq, Hkv, Nq, Nk, d;
  bool causal;
  int64_t input_pos;  // kDefaultPos: Nk - Nq
  DType dtype;
  float dropout;
};

std::string case_name(const BwdCase& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "_G" << c.Hq / c.Hkv << "_Nq" << c.Nq << "_Nk" << c.Nk << "_d" << c.d << "_"
    << dtype_name(c.dtype);
  if (c.causal) s << "_causal" << (c.input_pos == kDefaultPos ? "" : "_pos" + std::to_string(c.input_pos));
  if (c.dropout > 0) s << "_dropout";
  std::string n = s.str();
  for (char& ch : n)
    if (ch == '-') ch = 'm';
  return n;
}

void PrintTo(const BwdCase& c, std::ostream* os) { *os << case_name(c); }

// A covering grid: every N, head dim and causal flag, with dtype, GQA group and dropout rotating through
// their values, plus Nq != Nk with default and explicit positions (rows that see no key included). Sizes
// stay small enough for the fp64 reference to be quick (N <= 1000, few heads).
std::vector<BwdCase> grid() {
  std::vector<BwdCase> cs;
  int k = 0;
  for (int64_t n : {1, 17, 64, 127, 128, 1000})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        const int64_t group = std::array<int64_t, 3>{1, 2, 8}[k % 3];
        const int64_t hq = group == 8 ? 8 : n >= 1000 ? 2 : 4;
        const int64_t b = n >= 1000 ? 1 : 2;
        const DType t = k % 2 ? DType::fp16 : DType::bf16;
        cs.push_back({b, hq, hq / group, n, n, d, causal, kDefaultPos, t, k % 4 == 3 ? 0.15f : 0.0f});
        ++k;
      }
  for (int64_t d : {64, 128}) {
    cs.push_back({2, 4, 2, 17, 300, d, true, kDefaultPos, DType::bf16, 0.0f});  // a KV cache: Nq < Nk
    cs.push_back({1, 4, 4, 100, 300, d, true, 50, DType::fp16, 0.1f});         // explicit input_pos
    cs.push_back({1, 8, 1, 1, 1000, d, true, kDefaultPos, DType::bf16, 0.0f});   // one row, GQA 8
    cs.push_back({2, 4, 4, 128, 64, d, true, kDefaultPos, DType::bf16, 0.0f});   // Nq > Nk: rows 0-63 see nothing
    cs.push_back({2, 4, 2, 77, 200, d, false, kDefaultPos, DType::fp16, 0.1f});
    cs.push_back({1, 8, 4, 300, 129, d, true, 0, DType::bf16, 0.2f});
    cs.push_back({1, 4, 2, 64, 100, d, true, -20, DType::fp16, 0.0f});          // rows 0-19 see nothing
  }
  return cs;
}

// "stage:variant" for every GPU stage with a backward and each of its variants; `deterministic_only`
// leaves out the variants named "atomic" (FlashAttention 2's atomic dQ sums in a varying order).
std::vector<std::string> backward_stages(bool deterministic_only = false) {
  std::vector<std::string> v;
  for (const Stage& s : stages()) {
    if (!s.gpu || !s.has_backward) continue;
    if (s.variants.empty()) v.push_back(s.name);
    for (const std::string& var : s.variants)
      if (!deterministic_only || var != "atomic") v.push_back(s.name + ":" + var);
  }
  return v;
}

Problem to_problem(const BwdCase& c, uint64_t seed) {
  Problem p;
  p.B = c.B;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.d = c.d;
  p.causal = c.causal;
  p.input_pos = c.input_pos == kDefaultPos ? c.Nk - c.Nq : c.input_pos;
  p.scale = 1.0f / std::sqrt(float(c.d));
  p.dtype = c.dtype;
  p.dropout = c.dropout;
  p.seed = seed;
  p.backward = true;
  p.validate();
  return p;
}

// The stage and variant of "stage:variant", or a reason to skip ("" when the case can run).
std::string resolve(const std::string& stage_variant, const Problem& p, const Stage*& s, std::string& variant) {
  if (std::string why = gpu_unavailable_reason(); !why.empty()) return why;
  const size_t colon = stage_variant.find(':');
  s = &find_stage(stage_variant.substr(0, colon));
  variant = colon == std::string::npos ? "" : stage_variant.substr(colon + 1);
  if (std::string why = s->unsupported(p, variant); !why.empty())
    return stage_variant + " does not support this case: " + why;
  return "";
}

using Param = std::tuple<std::string, BwdCase>;

class GpuBackward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuBackward, MatchesReference) {
  const auto& [stage_variant, c] = GetParam();
  const Problem p = to_problem(c, std::hash<std::string>{}(case_name(c)) & 0xffff);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(stage_variant, p, s, variant); !why.empty()) GTEST_SKIP() << why;

  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  runner->run_backward();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  ASSERT_EQ(r.n, 5);
  for (int k = 0; k < r.n; ++k) {
    const ErrorStats& e = r.stage[k];
    EXPECT_TRUE(r.verdict[k].pass) << CheckReport::name(k) << ": max_abs " << e.max_abs << " > tolerance "
                                   << r.verdict[k].tolerance << " (naive low precision " << r.baseline[k].max_abs
                                   << "), unwritten " << e.unwritten << ", inf mismatches " << e.mismatched_inf;
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuBackward,
                         ::testing::Combine(::testing::ValuesIn(backward_stages()), ::testing::ValuesIn(grid())),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           std::string n = std::get<0>(info.param) + "_" + case_name(std::get<1>(info.param));
                           std::replace(n.begin(), n.end(), ':', '_');
                           return n;
                         });

// Two backward runs on the same forward give bitwise identical dQ, dK and dV: causal, GQA, dropout and
// tails, where an atomic accumulation order would show.
class GpuBackwardDeterminism : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBackwardDeterminism, TwoRunsSameBits) {
  for (int64_t d : {64, 128}) {
    const Problem p = to_problem({2, 8, 2, 300, 257, d, true, kDefaultPos, DType::bf16, 0.1f}, 7);
    const Stage* s = nullptr;
    std::string variant;
    if (const std::string why = resolve(GetParam(), p, s, variant); !why.empty()) GTEST_SKIP() << why;
    const Inputs in = random_inputs(p);
    auto runner = s->make(p, in, variant);
    runner->run();
    runner->run_backward();
    const Outputs a = runner->outputs();
    runner->run_backward();
    const Outputs b = runner->outputs();
    const Tensor* ta[] = {&a.dq, &a.dk, &a.dv};
    const Tensor* tb[] = {&b.dq, &b.dk, &b.dv};
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(ta[k]->size(), tb[k]->size());
      EXPECT_EQ(std::memcmp(ta[k]->ptr(), tb[k]->ptr(), ta[k]->size() * sizeof(float)), 0)
          << CheckReport::name(k + 2) << " differs between two runs (d = " << d << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuBackwardDeterminism, ::testing::ValuesIn(backward_stages(true)),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), ':', '_');
                           return n;
                         });

}  // namespace
}  // namespace fa
