// FlashAttention, step by step — the GPU test grid: every GPU stage of the registry against step 1.
//
// Each case draws fresh random inputs (offset from zero), runs the stage on outputs poisoned with NaN,
// and checks O and LSE against step 1 in fp64 under the FlashAttention rule (core/metrics.h): every
// element written, max error <= 2x that of naive attention in the same precision (+ a tiny epsilon).
// A stage is listed on the cases it declares it runs (core/stage.h, Supports), so refusing one fails; a case
// is skipped, with the reason, only where the stage cannot run at all (no CUDA device: CI has no GPU).
#include <array>

#include "gpu_grid.h"

namespace fa::grid {
namespace {

// A covering grid rather than the full product: every N, head dim and causal flag, with dtype, GQA group
// and dropout rotating through their values, plus the Nq != Nk and input_pos cases.
std::vector<Case> grid() {
  std::vector<Case> cs;
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

using Param = std::tuple<std::string, Case>;

class GpuForward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuForward, MatchesReference) {
  const auto& [stage_variant, c] = GetParam();
  const Problem p = to_problem(c, /*backward=*/false);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*s, p, variant), "");

  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  expect_pass(check_against_reference(p, in, runner->outputs()));
}

// Every GPU stage that owns forward kernels, every variant of it that runs a configuration of its own
// (every configuration by name: test_gpu_configs.cpp), on the cases it declares it runs.
INSTANTIATE_TEST_SUITE_P(Grid, GpuForward,
                         ::testing::ValuesIn(grid_entries(Pass::forward, grid(), [](const std::string&) { return true; })),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param) + "_" + case_name(std::get<1>(info.param)));
                         });

// Host-side (no GPU: it runs in CI): on every case of this grid, each GPU stage declares exactly what its
// unsupported() accepts, so the grid above lists every case a stage runs and none it refuses (the stages
// that borrow another's forward kernels are checked too).
TEST(GridDeclarations, ForwardCasesAgreeWithRefusals) {
  for (const Case& c : grid()) expect_declarations_agree(to_problem(c, /*backward=*/false), [](const Stage&) { return true; });
}

}  // namespace
}  // namespace fa::grid
