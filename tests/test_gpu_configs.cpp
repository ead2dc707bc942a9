// FlashAttention, step by step — every compiled configuration against step 1 (tests/test_gpu_configs.cpp).
//
// The grids (test_gpu_forward.cpp, test_gpu_backward.cpp) run each stage's variants on many shapes; this
// runs every configuration a stage compiles (its tuning_variants: what --variant can name and step 6 may
// time and pick) on a covering set of cases, so that no configuration is timed or tuned before it was
// checked. Per head dim the cases cover tails, causal with an explicit input_pos (rows that see no key
// included), Nq != Nk both ways, GQA and MQA, and each of bf16 / fp16 with and without dropout: every
// kernel instance (dtype x dropout) of every configuration runs at least once. A backward configuration
// checks O, LSE, dQ, dK and dV. A configuration is listed on the cases its stage declares it runs (a refusal
// fails); without a CUDA device every case is skipped with the reason.
#include <algorithm>

#include "gpu_grid.h"

namespace fa::grid {
namespace {

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (int64_t d : {64, 128}) {
    //          B  Hq Hkv  Nq    Nk   d  causal input_pos    dtype        dropout
    cs.push_back({2, 4, 4, 257, 257, d, false, kDefaultPos, DType::bf16, 0.0f});   // tails
    cs.push_back({1, 8, 2, 300, 300, d, true, kDefaultPos, DType::fp16, 0.0f});    // GQA 4, causal, tails
    cs.push_back({1, 8, 1, 100, 300, d, true, 50, DType::bf16, 0.1f});             // MQA, explicit input_pos
    cs.push_back({2, 4, 4, 128, 64, d, true, kDefaultPos, DType::fp16, 0.15f});    // Nq > Nk: rows 0-63 see nothing
    cs.push_back({1, 4, 2, 64, 100, d, true, -20, DType::bf16, 0.0f});             // rows 0-19 see nothing
    cs.push_back({1, 8, 1, 17, 1000, d, true, kDefaultPos, DType::fp16, 0.1f});    // a KV cache, MQA
    cs.push_back({2, 4, 2, 200, 200, d, false, kDefaultPos, DType::bf16, 0.2f});   // dropout, GQA 2
    cs.push_back({1, 4, 4, 513, 513, d, true, kDefaultPos, DType::fp16, 0.0f});    // causal, one row past 512
  }
  return cs;
}

using Param = std::tuple<std::string, Case>;  // "stage:configuration", case

// Every (stage, configuration, case) whose configuration is compiled for the case's head dim and which the
// stage declares it runs (core/stage.h, Supports: step 7 no dropout).
std::vector<Param> entries() {
  std::vector<Param> out;
  for (const Stage& s : stages()) {
    if (!s.gpu() || s.tuning_variants.empty()) continue;
    for (const std::string& config : s.tuning_variants)
      for (const Case& c : cases()) {
        const Problem p = to_problem(c, s.has_backward);
        try {
          s.launch_shape(p, config);  // throws for a configuration the head dim does not compile
        } catch (const std::invalid_argument&) {
          continue;
        }
        if (declares(s, p, config)) out.emplace_back(s.name + ":" + config, c);
      }
  }
  return out;
}

class GpuConfigs : public ::testing::TestWithParam<Param> {};

TEST_P(GpuConfigs, MatchesReference) {
  const auto& [stage_config, c] = GetParam();
  const std::string stage_name = stage_config.substr(0, stage_config.find(':'));
  const Stage& s = find_stage(stage_name);
  const Problem p = to_problem(c, s.has_backward);
  const Stage* stage = nullptr;
  std::string config;
  if (const std::string why = resolve(stage_config, stage, config); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*stage, p, config), "");

  const Inputs in = random_inputs(p);
  auto runner = stage->make(p, in, config);
  runner->run();
  if (p.backward) runner->run_backward();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  ASSERT_EQ(r.n, p.backward ? 5 : 2);
  expect_pass(r);
}

// Step 4's chapter walks through sub-steps 4a-4f: each is a variant, in order, and on either architecture
// and head dim it names a configuration that is compiled (so the grid and the test above both run it);
// 4d is the default, 4e is 4d's configuration with the score modifiers' mask type (chosen by the problem),
// 4f the split-KV configuration. Host-side only: it runs without a GPU.
TEST(Step4Substeps, VariantsNameCompiledConfigurations) {
  const Stage& s = find_stage("step4_fused_pipelined");
  const std::vector<std::string> substeps = {"4a-padded", "4b-swizzle",    "4c-cp-async",
                                             "4d-tma",    "4e-score-mods", "4f-split-kv"};
  auto at = std::search(s.variants.begin(), s.variants.end(), substeps.begin(), substeps.end());
  ASSERT_NE(at, s.variants.end()) << "step 4's variants list the sub-steps in order";
  for (int cc : {9, 12})
    for (int64_t d : {64, 128}) {
      const Problem p = to_problem({1, 4, 4, 256, 256, d, false, kDefaultPos, DType::bf16, 0.0f}, false);
      std::vector<std::string> configs;
      for (const std::string& v : substeps) {
        const std::string config = s.config_of(p, v, cc);
        EXPECT_NE(std::find(s.tuning_variants.begin(), s.tuning_variants.end(), config), s.tuning_variants.end())
            << v << " -> " << config << " is not a compiled configuration";
        if (v < "4d") {
          EXPECT_EQ(config.substr(0, 3), v.substr(0, 2) + "-") << v << " runs " << config;
        }
        configs.push_back(config);
      }
      EXPECT_EQ(configs[3], s.config_of(p, "auto", cc)) << "4d is the default";
      EXPECT_EQ(configs[4], configs[3]) << "4e is 4d's configuration (the mask type comes from the problem)";
      EXPECT_NE(std::find(s.supports.splits.begin(), s.supports.splits.end(), configs[5]), s.supports.splits.end())
          << "4f runs split-KV: " << configs[5];
      configs.pop_back();
      configs.pop_back();
      std::sort(configs.begin(), configs.end());
      EXPECT_EQ(std::unique(configs.begin(), configs.end()), configs.end()) << "4a-4d: each sub-step its own kernel";
    }
}

// The sm_8x family (A100, RTX 30/40, L4: no TMA): step 4's default there, for decoding too, is 4c's kernel at
// 64 x 64 tiles, the configuration "sm80" forces on any GPU (so the H100 grid runs it), and the sub-steps 4a-4c
// resolve to kernels without TMA; what resolves to a TMA kernel is refused at launch (launch.cu). Host-side.
TEST(Step4Families, Sm8xRunsKernelsWithoutTma) {
  const Stage& s = find_stage("step4_fused_pipelined");
  ASSERT_NE(std::find(s.variants.begin(), s.variants.end(), "sm80"), s.variants.end());
  for (int64_t d : {64, 128})
    for (int64_t Nq : {1, 16, 512}) {  // decoding (4f elsewhere) and not
      const Problem p = to_problem({2, 4, 4, Nq, 512, d, true, kDefaultPos, DType::bf16, 0.0f}, false);
      const std::string dflt = s.config_of(p, "auto", 8);
      EXPECT_EQ(dflt.substr(0, 3), "4c-") << "d = " << d << ", Nq = " << Nq << ": " << dflt;
      EXPECT_NE(dflt.find("Br64-Bc64"), std::string::npos) << dflt << ": the tiles every sm_8x part holds";
      for (int cc : {9, 12}) EXPECT_EQ(s.config_of(p, "sm80", cc), dflt) << "sm80 forces it on cc " << cc;
      for (const std::string v : {"4a-padded", "4b-swizzle", "4c-cp-async"})
        EXPECT_EQ(s.config_of(p, v, 8).substr(0, 2), v.substr(0, 2)) << v << " on sm_8x";
      EXPECT_NE(std::find(s.tuning_variants.begin(), s.tuning_variants.end(), dflt), s.tuning_variants.end())
          << dflt << " is compiled";
    }
}

// Host-side (no GPU: it runs in CI): on every case above, forward and backward, each GPU stage declares exactly
// what its unsupported() accepts, in every variant and every configuration compiled for the head dim.
TEST(GridDeclarations, ConfigCasesAgreeWithRefusals) {
  for (const Case& c : cases())
    for (bool backward : {false, true}) expect_declarations_agree(to_problem(c, backward), [](const Stage&) { return true; });
}

INSTANTIATE_TEST_SUITE_P(All, GpuConfigs, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param) + "_" + case_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace fa::grid
