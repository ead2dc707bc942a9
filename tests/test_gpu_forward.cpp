// FlashAttention, step by step — the GPU test grid: every GPU stage of the registry against step 1.
//
// Each case draws fresh random inputs (offset from zero), runs the stage on outputs poisoned with NaN,
// and checks O and LSE against step 1 in fp64 under the FlashAttention rule (common/metrics.h): every
// element written, max error <= 2x that of naive attention in the same precision (+ a tiny epsilon).
// Without a CUDA device every case is skipped with the reason (CI has no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "common/harness.h"

namespace fa {
namespace {

constexpr int64_t kDefaultPos = INT64_MIN;

struct GpuCase {
  int64_t B, Hq, Hkv, Nq, Nk, d;
  bool causal;
  int64_t input_pos;  // kDefaultPos: Nk - Nq
  DType dtype;
  float dropout;
};

std::string case_name(const GpuCase& c) {
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

// Readable test parameters in gtest's output (instead of the bytes of the struct).
void PrintTo(const GpuCase& c, std::ostream* os) { *os << case_name(c); }

// A covering grid rather than the full product: every N, head dim and causal flag, with dtype, GQA group
// and dropout rotating through their values, plus the Nq != Nk and input_pos cases.
std::vector<GpuCase> grid() {
  std::vector<GpuCase> cs;
  int k = 0;
  for (int64_t n : {1, 17, 64, 127, 128, 1000, 4096})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        const int64_t group = std::array<int64_t, 3>{1, 2, 8}[k % 3];
        const int64_t hq = n >= 4096 ? std::max<int64_t>(2, group) : 8;  // keep the fp64 reference quick
        const int64_t b = n >= 1000 ? 1 : 2;
        const DType t = k % 2 ? DType::fp16 : DType::bf16;
        cs.push_back({b, hq, hq / group, n, n, d, causal, kDefaultPos, t, k % 4 == 3 ? 0.15f : 0.0f});
        ++k;
      }
  // Nq != Nk: a KV cache (Nq < Nk) with default and explicit positions, Nq > Nk (rows that see nothing).
  for (int64_t d : {64, 128}) {
    cs.push_back({2, 8, 2, 17, 1000, d, true, kDefaultPos, DType::bf16, 0.0f});
    cs.push_back({2, 8, 8, 100, 300, d, true, 50, DType::fp16, 0.0f});
    cs.push_back({1, 8, 1, 1, 4096, d, true, kDefaultPos, DType::bf16, 0.0f});
    cs.push_back({2, 4, 4, 128, 64, d, true, kDefaultPos, DType::bf16, 0.0f});
    cs.push_back({2, 4, 2, 77, 200, d, false, kDefaultPos, DType::fp16, 0.1f});
    cs.push_back({1, 8, 4, 300, 129, d, true, 0, DType::bf16, 0.2f});
  }
  // fp32 storage, for the stages that support it.
  cs.push_back({2, 4, 2, 127, 127, 64, true, kDefaultPos, DType::fp32, 0.0f});
  cs.push_back({1, 4, 4, 64, 1000, 128, false, kDefaultPos, DType::fp32, 0.1f});
  return cs;
}

// "stage" or "stage:variant" for every GPU stage and each of its variants.
std::vector<std::string> gpu_stages() {
  std::vector<std::string> v;
  for (const Stage& s : stages()) {
    if (!s.gpu) continue;
    if (s.variants.empty()) v.push_back(s.name);
    for (const std::string& var : s.variants) v.push_back(s.name + ":" + var);
  }
  return v;
}

Problem to_problem(const GpuCase& c, uint64_t seed) {
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
  p.validate();
  return p;
}

using Param = std::tuple<std::string, GpuCase>;

class GpuForward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuForward, MatchesReference) {
  const auto& [stage_variant, c] = GetParam();
  if (const std::string why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const size_t colon = stage_variant.find(':');
  const Stage& s = find_stage(stage_variant.substr(0, colon));
  const std::string variant = colon == std::string::npos ? "" : stage_variant.substr(colon + 1);
  const Problem p = to_problem(c, std::hash<std::string>{}(case_name(c)) & 0xffff);
  if (const std::string why = s.unsupported(p, variant); !why.empty())
    GTEST_SKIP() << stage_variant << " does not support this case: " << why;

  const Inputs in = random_inputs(p);
  auto runner = s.make(p, in, variant);
  runner->run();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  for (int k = 0; k < r.n; ++k) {
    const ErrorStats& e = r.stage[k];
    EXPECT_TRUE(r.verdict[k].pass) << CheckReport::name(k) << ": max_abs " << e.max_abs << " > tolerance "
                                   << r.verdict[k].tolerance << " (naive low precision " << r.baseline[k].max_abs
                                   << "), unwritten " << e.unwritten << ", inf mismatches " << e.mismatched_inf;
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuForward, ::testing::Combine(::testing::ValuesIn(gpu_stages()), ::testing::ValuesIn(grid())),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           std::string n = std::get<0>(info.param) + "_" + case_name(std::get<1>(info.param));
                           std::replace(n.begin(), n.end(), ':', '_');
                           return n;
                         });

}  // namespace
}  // namespace fa
