// FlashAttention, step by step — split-KV decoding against step 1 (tests/test_gpu_decode.cpp).
//
// Step 4's forward at decode shapes (a few query rows against a long KV cache) takes the split-KV kernel
// (kernel_4f_split_kv.cuh): the key range split among blocks, partial results merged by combine.cuh, and the
// query heads of a GQA group packed into one tile. This grid forces the number of splits (1, 2, 3, 7, and
// more splits than K/V tiles, so some splits see no key), and also lets the heuristic choose (0), over
// Nq in {1, 4, 16}, groups 1, 4, 8 and MQA, causal with input_pos (negative: rows that see nothing, and
// splits past every row's diagonal), key tails, dropout (no packing) and fp16; O and LSE are checked under
// the FlashAttention rule. Step 4 declares every case (a refusal fails); without a CUDA device every case is
// skipped with the reason.
#include "gpu/gpu_runner.h"
#include "gpu_grid.h"
#include "step4_fused_pipelined/configs.h"

namespace fa::grid {
namespace {

struct DecodeCase {
  Case c;
  int64_t splits;  // 0: chosen from the shape
};

std::string decode_name(const DecodeCase& dc) { return case_name(dc.c) + "_splits" + std::to_string(dc.splits); }

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> out;
  int k = 0;
  for (int64_t splits : {1, 2, 3, 7, 40, 0})
    for (int64_t d : {64, 128}) {
      //                 B  Hq Hkv  Nq    Nk    d  causal input_pos   dtype        dropout
      out.push_back({{2, 8, 2, 1, 1000, d, true, kDefaultPos, k % 2 ? DType::fp16 : DType::bf16, 0.0f}, splits});
      out.push_back({{1, 8, 1, 4, 777, d, true, kDefaultPos, DType::bf16, 0.0f}, splits});       // MQA, group 8
      out.push_back({{2, 4, 4, 16, 1000, d, true, 900, DType::fp16, 0.0f}, splits});           // no GQA, explicit pos
      out.push_back({{1, 8, 2, 16, 300, d, true, -5, DType::bf16, 0.0f}, splits});             // rows 0-4 see nothing
      out.push_back({{2, 8, 2, 4, 513, d, false, kDefaultPos, DType::bf16, 0.1f}, splits});    // dropout: not packed
      out.push_back({{1, 8, 8, 1, 64, d, true, kDefaultPos, DType::fp16, 0.0f}, splits});      // one K/V tile
      ++k;
    }
  return out;
}

class GpuDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(GpuDecode, MatchesReference) {
  const DecodeCase& dc = GetParam();
  Problem p = to_problem(dc.c, /*backward=*/false);
  p.splits = dc.splits;
  p.validate();
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve("step4_fused_pipelined:auto", s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*s, p, variant), "");
  EXPECT_TRUE(step4::is_split_kv(s->config_of(p, variant, grid_cc_major()))) << "decode shapes run the split-KV kernel";

  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  // Once more over poisoned outputs: the second launch must write every element as well (the last split of a
  // short tile is found by counters that each launch leaves at zero for the next).
  auto* gpu = dynamic_cast<GpuRunner*>(runner.get());
  ASSERT_NE(gpu, nullptr) << "step 4's runner is a GpuRunner";
  gpu->poison_outputs();
  runner->run();
  expect_pass(check_against_reference(p, in, runner->outputs()));
}

// Host-side (no GPU: it runs in CI): step 4 declares every case above in "auto" (the suite lists them all), and
// on each, every GPU stage declares exactly what its unsupported() accepts.
TEST(GridDeclarations, DecodeCasesAgreeWithRefusals) {
  const Stage& s = find_stage("step4_fused_pipelined");
  for (const DecodeCase& dc : cases()) {
    Problem p = to_problem(dc.c, /*backward=*/false);
    p.splits = dc.splits;
    p.validate();
    EXPECT_TRUE(declares(s, p, "auto")) << decode_name(dc);
    expect_declarations_agree(p, [](const Stage&) { return true; });
  }
}

INSTANTIATE_TEST_SUITE_P(Step4, GpuDecode, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) { return param_name(decode_name(info.param)); });

}  // namespace
}  // namespace fa::grid
