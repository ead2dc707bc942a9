// FlashAttention, step by step — the GPU backward grid: every GPU stage with a backward against step 1.
//
// Each case draws fresh random inputs (and dO), runs the stage's forward then its backward on outputs
// poisoned with NaN, and checks O, LSE, dQ, dK and dV against step 1 in fp64 under the FlashAttention rule
// (core/metrics.h): every element written, max error <= 2x that of naive attention in the same
// precision (+ a tiny epsilon). A second test runs the backward twice and wants the same bits (no atomics).
// A stage is listed on the cases it declares it runs (core/stage.h, Supports), so refusing one fails; a case
// is skipped, with the reason, only where the stage cannot run at all (no CUDA device: CI has no GPU).
#include <array>
#include <cstring>

#include "gpu_grid.h"

namespace fa::grid {
namespace {

// A covering grid: every N, head dim and causal flag, with dtype, GQA group and dropout rotating through
// their values, plus Nq != Nk with default and explicit positions (rows that see no key included). Sizes
// stay small enough for the fp64 reference to be quick (N <= 1000, few heads).
std::vector<Case> grid() {
  std::vector<Case> cs;
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

using Param = std::tuple<std::string, Case>;

class GpuBackward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuBackward, MatchesReference) {
  const auto& [stage_variant, c] = GetParam();
  const Problem p = to_problem(c, /*backward=*/true);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*s, p, variant), "");

  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  runner->run_backward();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  ASSERT_EQ(r.n, 5);
  expect_pass(r);
}

// Every GPU stage that owns backward kernels, every variant of it that runs a configuration of its own.
INSTANTIATE_TEST_SUITE_P(Grid, GpuBackward,
                         ::testing::ValuesIn(grid_entries(Pass::backward, grid(), [](const std::string&) { return true; })),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param) + "_" + case_name(std::get<1>(info.param)));
                         });

// Two backward runs on the same forward give bitwise identical dQ, dK and dV: causal, GQA, dropout and
// tails, where an atomic accumulation order would show; at d = 64 and 128.
Case determinism_case(int64_t d) { return {2, 8, 2, 300, 257, d, true, kDefaultPos, DType::bf16, 0.1f}; }

class GpuBackwardDeterminism : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBackwardDeterminism, TwoRunsSameBits) {
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(GetParam(), s, variant); !why.empty()) GTEST_SKIP() << why;
  // Each head dim the variant declares, whatever happens to the other: a refusal fails that d alone.
  int declared = 0;
  for (int64_t d : {64, 128}) {
    const Problem p = to_problem(determinism_case(d), /*backward=*/true);
    if (!declares(*s, p, variant)) continue;
    ++declared;
    if (const std::string why = refusal(*s, p, variant); !why.empty()) {
      ADD_FAILURE() << why;
      continue;
    }
    const Inputs in = random_inputs(p);
    auto runner = s->make(p, in, variant);
    expect_backward_repeats(*runner, 0, 3, d);  // dQ, dK, dV
  }
  EXPECT_GT(declared, 0) << "listed, so it declares at least one head dim";
}

// Variants named "atomic" (FlashAttention 2's atomic dQ, summed in a varying order) are left out, and so is a
// variant that declares neither head dim of the case.
bool declares_a_determinism_case(const std::string& stage_variant) {
  const size_t colon = stage_variant.find(':');
  const Stage& s = find_stage(stage_variant.substr(0, colon));
  const std::string v = colon == std::string::npos ? "" : stage_variant.substr(colon + 1);
  for (int64_t d : {64, 128})
    if (declares(s, to_problem(determinism_case(d), /*backward=*/true), v)) return true;
  return false;
}

std::vector<std::string> determinism_entries() {
  std::vector<std::string> out;
  for (const std::string& sv : stage_variants([](const Stage& s) { return s.has_backward && s.backward_from.empty(); },
                                              [](const std::string& v) { return v.rfind("atomic", 0) != 0; }))
    if (declares_a_determinism_case(sv)) out.push_back(sv);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuBackwardDeterminism, ::testing::ValuesIn(determinism_entries()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return param_name(info.param); });

// Host-side (no GPU: it runs in CI): on every case of this grid and of the determinism test, each GPU stage
// declares exactly what its unsupported() accepts (those with backward kernels of their own are the grid's;
// the others, which borrow them, are checked too).
TEST(GridDeclarations, BackwardCasesAgreeWithRefusals) {
  std::vector<Case> cs = grid();
  for (int64_t d : {64, 128}) cs.push_back(determinism_case(d));
  for (const Case& c : cs) expect_declarations_agree(to_problem(c, /*backward=*/true), [](const Stage&) { return true; });
}

}  // namespace
}  // namespace fa::grid
