// FlashAttention, step by step — step 7 (Hopper only) in a training step: its forward, then the backward.
//
// The forward grids check step 7's kernels on their own. Its backward is step 5's (backward_from), which
// the backward grid checks once, after step 5's own forward; here step 5's backward runs on what step 7's
// forward saved (O, LSE), as a training step would. Each case runs one sub-step's forward, then the
// backward, and checks O, LSE, dQ, dK and dV against step 1 in fp64 under the tolerance rule
// (core/metrics.h). Built only with step 7 (90 among the CUDA architectures); on a GPU that is not a
// Hopper, every case is skipped with step 7's reason.
#include <algorithm>

#include "gpu_grid.h"
#include "step6_autotune/autotune.h"

namespace fa::grid {
namespace {

const char* const kStage = "step7_hopper_wgmma";
const std::vector<std::string> kSubsteps = {"7a-wgmma", "7b-specialized", "7c-pingpong", "7d-persistent"};

using Param = std::tuple<std::string, int64_t, bool>;  // variant, head dim, causal

class GpuStep7Training : public ::testing::TestWithParam<Param> {};

TEST_P(GpuStep7Training, MatchesReference) {
  const auto& [substep, d, causal] = GetParam();
  // GQA 2 and tails (300 rows and keys: no multiple of a tile), bf16, the default input_pos.
  const Problem p = to_problem({2, 4, 2, 300, 300, d, causal, kDefaultPos, DType::bf16, 0.0f}, /*backward=*/true);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(std::string(kStage) + ":" + substep, s, variant); !why.empty()) GTEST_SKIP() << why;
  // On a Hopper GPU the stage runs every case of this suite (it declares them): a refusal is a failure, not a skip.
  ASSERT_EQ(refusal(*s, p, variant), "");

  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  runner->run_backward();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  ASSERT_EQ(r.n, 5);
  expect_pass(r);
}

INSTANTIATE_TEST_SUITE_P(Step7, GpuStep7Training,
                         ::testing::Combine(::testing::ValuesIn(kSubsteps), ::testing::Values(int64_t{64}, int64_t{128}),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param) + "_d" + std::to_string(std::get<1>(info.param)) +
                                             (std::get<2>(info.param) ? "_causal" : ""));
                         });

// What the suite above relies on, host-side (it runs without a GPU): the chapter's sub-steps are variants,
// in order, and the backward is step 5's.
TEST(Step7Stage, SubstepsAreVariantsAndTheBackwardIsStep5s) {
  const Stage& s = find_stage(kStage);
  EXPECT_NE(std::search(s.variants.begin(), s.variants.end(), kSubsteps.begin(), kSubsteps.end()), s.variants.end())
      << "step 7's variants list the sub-steps in order";
  EXPECT_TRUE(s.gpu());
  EXPECT_TRUE(s.has_backward);
  EXPECT_EQ(s.backward_from, "step5_backward");
}

// The default per problem (configs.h, choose). At d = 128, with a mask or without: 7d up to 4096 keys, 7c with
// 176-key tiles beyond. At d = 64 with a causal mask: three blocks of 64 rows (64-key tiles) per SM up to 2048
// keys, then three consumer warpgroups in one block (Br = 192); without one: 7d up to 1024 keys, then Br = 192.
TEST(Step7Stage, AutoPicksByMaskAndKeyLength) {
  const Stage& s = find_stage(kStage);
  for (const int64_t d : {64, 128}) {
    auto config = [&](bool causal, int64_t Nk) {
      return s.config_of(to_problem({1, 4, 4, 512, Nk, d, causal, kDefaultPos, DType::bf16, 0.0f}, false), "auto", 9);
    };
    if (d == 128) {
      for (const bool causal : {false, true}) {
        EXPECT_EQ(config(causal, 512), "7d-Br128-Bc128-S2");
        EXPECT_EQ(config(causal, 4096), "7d-Br128-Bc128-S2");
        EXPECT_EQ(config(causal, 4097), "7c-Br128-Bc176-S2");
      }
      continue;
    }
    EXPECT_EQ(config(true, 512), "7c-Br64-Bc64-S2-3perSM");
    EXPECT_EQ(config(true, 2048), "7c-Br64-Bc64-S2-3perSM");
    EXPECT_EQ(config(true, 2049), "7c-Br192-Bc128-S2");
    EXPECT_EQ(config(true, 16384), "7c-Br192-Bc128-S2");
    EXPECT_EQ(config(false, 1024), "7d-Br128-Bc128-S2");
    EXPECT_EQ(config(false, 1025), "7c-Br192-Bc128-S2");
    EXPECT_EQ(config(false, 16384), "7c-Br192-Bc128-S2");
  }
}

// What step 7 leaves out says so, before any GPU work: dropout and the score modifiers (steps 4 and 5 have
// them), and a configuration name it does not know.
TEST(Step7Stage, RefusesWhatItLeavesOut) {
  const Stage& s = find_stage(kStage);
  Problem p = to_problem({1, 4, 4, 256, 256, 64, false, kDefaultPos, DType::bf16, 0.1f}, false);
  EXPECT_NE(s.unsupported(p, "auto").find("dropout"), std::string::npos);
  p.dropout = 0;
  EXPECT_EQ(s.unsupported(p, "auto"), "");
  p.softcap = 30.0f;
  EXPECT_NE(s.unsupported(p, "auto").find("score modifiers"), std::string::npos);
  EXPECT_FALSE(s.has_score_mods);
  p.softcap = 0.0f;
  EXPECT_NE(s.unsupported(p, "7c-Br64-Bc96-S2").find("no config"), std::string::npos);
}

// Step 6's filter on step 7's configurations (it runs without a GPU): on an H100 every configuration but the
// lessons 7a and 7b is a candidate, the default among them. (Elsewhere the stage's platform refuses to run at
// all, before any tuning.)
TEST(Step7Stage, Step6TunesItsConfigurations) {
  const Stage& s = find_stage(kStage);
  const step6::DeviceLimits h100{"NVIDIA H100 80GB HBM3 (fake)", 9, 0, 227 * 1024, 1024};
  for (const int64_t d : {64, 128}) {
    for (const bool causal : {false, true}) {
      const Problem p = to_problem({1, 4, 4, 1024, 1024, d, causal, kDefaultPos, DType::bf16, 0.0f}, false);
      std::vector<std::string> rejected;
      const auto ok = step6::feasible_variants(s, p, h100, &rejected);
      const size_t d64_only = d == 64 ? 0 : 5;  // the Br = 64 and 192 configurations exist at d = 64 only (configs.h)
      EXPECT_EQ(ok.size(), s.tuning_variants.size() - 2 - d64_only) << "d = " << d;
      EXPECT_EQ(rejected.size(), 2u + d64_only);
      for (const std::string& r : rejected)
        EXPECT_TRUE(r.find("sub-step") != std::string::npos || r.find("no config") != std::string::npos) << r;
      EXPECT_NE(std::find(ok.begin(), ok.end(), s.config_of(p, "auto", 9)), ok.end()) << "the default is a candidate";
    }
  }
}

}  // namespace
}  // namespace fa::grid
