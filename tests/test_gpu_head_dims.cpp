// FlashAttention, step by step — head dims the kernels are not compiled for (tests/test_gpu_head_dims.cpp).
//
// core/padded_head_dim.h: steps 3, 4, 5 and 7 compile d = 64 and 128, and run any other multiple of 8 up to 128
// on the next of them, the inputs zero-padded and the outputs cropped. On the GPU: d = 32 and 96 (and 8, 72)
// forward and backward, causal and not, GQA, dropout, a window and ALiBi, a packed batch and a paged KV cache,
// against step 1 at the problem's own head dim under the FlashAttention rule. On the host (CI): the padding and
// cropping, the wrapper on a CPU stage against the stage itself, and every stage's declarations against its
// refusals at the new head dims.
#include <cmath>

#include "core/padded_head_dim.h"
#include "core/varlen.h"
#include "gpu_grid.h"

namespace fa::grid {
namespace {

struct DimCase {
  std::string stage_variant;
  Case c;
  bool backward;
  std::string extra;  // "", "window+alibi", "varlen", "kvcache"
};

std::string dim_name(const DimCase& k) {
  return k.stage_variant + "_" + case_name(k.c) + (k.backward ? "_bwd" : "") + (k.extra.empty() ? "" : "_" + k.extra);
}

std::vector<DimCase> cases() {
  std::vector<DimCase> out;
  for (int64_t d : {32, 96}) {
    //                                   B  Hq Hkv  Nq   Nk  d  causal  input_pos   dtype        dropout
    const Case plain{2, 4, 2, 200, 333, d, true, kDefaultPos, DType::bf16, 0.0f};
    const Case cross{1, 8, 1, 130, 70, d, false, kDefaultPos, DType::fp16, 0.0f};
    out.push_back({"step3_naive_kernel", plain, false, ""});
    out.push_back({"step4_fused_pipelined:auto", plain, false, ""});
    out.push_back({"step4_fused_pipelined:auto", cross, false, "window+alibi"});
    out.push_back({"step4_fused_pipelined:auto", {3, 8, 2, 1, 700, d, true, kDefaultPos, DType::bf16, 0.0f}, false, "kvcache"});
    out.push_back({"step5_backward:deterministic", plain, true, ""});
    out.push_back({"step5_backward:deterministic", {2, 4, 4, 150, 150, d, true, kDefaultPos, DType::bf16, 0.1f}, true, ""});
    out.push_back({"step5_backward:atomic", cross, true, ""});
    out.push_back({"step5_backward:deterministic", plain, true, "varlen"});
    out.push_back({"step7_hopper_wgmma", plain, true, ""});
  }
  out.push_back({"step4_fused_pipelined:auto", {1, 4, 4, 100, 100, 8, false, kDefaultPos, DType::bf16, 0.0f}, false, ""});
  out.push_back({"step5_backward:deterministic", {1, 4, 4, 100, 100, 72, true, kDefaultPos, DType::bf16, 0.0f}, true, ""});
  return out;
}

Problem dim_problem(const DimCase& k) {
  Problem p = to_problem(k.c, k.backward);
  if (k.extra == "window+alibi") p.window_left = 40, p.window_right = 10, p.alibi = true;
  if (k.extra == "kvcache") p.cache_seqlens = {700, 129, 0}, p.page_size = 128;
  p.validate();
  return p;
}

class GpuPaddedHeadDim : public ::testing::TestWithParam<DimCase> {};

TEST_P(GpuPaddedHeadDim, MatchesStep1AtItsOwnHeadDim) {
  const DimCase& k = GetParam();
  const std::string stage = k.stage_variant.substr(0, k.stage_variant.find(':'));
  if (std::none_of(stages().begin(), stages().end(), [&](const Stage& st) { return st.name == stage; }))
    GTEST_SKIP() << stage << " is not built (step 7: only for sm_90)";
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(k.stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
  if (variant.empty() && !s->variants.empty()) variant = s->variants.front();
  const Problem p = dim_problem(k);
  if (k.extra == "varlen") {  // a packed batch: sequences of 0, 1, 17 and 300 tokens
    const Varlen v = varlen_from_lengths({0, 1, 17, 300}, {5, 1, 17, 300});
    Problem q = p;
    q.B = v.batch(), q.Nq = v.max_seqlen_q, q.Nk = v.max_seqlen_k, q.input_pos = q.Nk - q.Nq;
    const Inputs in = random_packed_inputs(q, v);
    auto runner = make_varlen_runner(*s, q, v, in, variant);
    runner->run();
    runner->run_backward();
    expect_pass(check_against(varlen_oracle(reference_oracle(), v), q, in, runner->outputs()));
    return;
  }
  ASSERT_EQ(refusal(*s, p, variant), "");
  const Inputs in = random_inputs(p);
  auto runner = s->make(p, in, variant);
  runner->run();
  if (k.backward) runner->run_backward();
  const Outputs out = runner->outputs();
  ASSERT_EQ(out.o.shape.back(), p.d);
  expect_pass(check_against_reference(p, in, out));
}

INSTANTIATE_TEST_SUITE_P(Padded, GpuPaddedHeadDim, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DimCase>& info) { return param_name(dim_name(info.param)); });

// ---- host-side (no GPU: they run in CI) ----

TEST(PaddedHeadDim, PadsAndCropsTheLastDimension) {
  EXPECT_EQ(padded_head_dim(32, {64, 128}), 64);
  EXPECT_EQ(padded_head_dim(96, {64, 128}), 128);
  EXPECT_EQ(padded_head_dim(64, {64, 128}), 64);
  EXPECT_EQ(padded_head_dim(136, {64, 128}), 0);  // past the largest
  EXPECT_EQ(padded_head_dim(36, {64, 128}), 0);   // not a multiple of 8
  Tensor x({2, 3});
  for (size_t i = 0; i < x.size(); ++i) x.data[i] = float(i + 1);
  const Tensor y = resize_last_dim(x, 5);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(y.data, (std::vector<float>{1, 2, 3, 0, 0, 4, 5, 6, 0, 0}));
  EXPECT_EQ(resize_last_dim(y, 3).data, x.data);
}

// The wrapper on step 1 told it compiles d = 64 only: d = 32 runs padded and gives step 1's own d = 32 outputs
// (the zero columns change no sum), forward and backward, causal, GQA; d = 72 and 36 are refused, saying why.
TEST(PaddedHeadDim, OnACpuStageEqualsTheStageItself) {
  Stage plain = find_stage("step1_cpu_reference");
  Stage narrow = plain;
  narrow.supports.head_dims = {64};
  const Stage padded = with_padded_head_dims(narrow);
  Problem p;
  p.B = 1, p.Hq = 4, p.Hkv = 2, p.Nq = 19, p.Nk = 23, p.d = 32, p.causal = true, p.input_pos = 4;
  p.scale = 1.0f / std::sqrt(32.0f), p.dtype = DType::fp32, p.backward = true;
  p.validate();
  ASSERT_EQ(padded.unsupported(p, ""), "");
  const Inputs in = random_inputs(p);
  auto run = [&](const Stage& s) {
    auto r = s.make(p, in, "");
    r->run();
    r->run_backward();
    return r->outputs();
  };
  const Outputs a = run(plain), b = run(padded);
  for (const auto& [x, y, name] : {std::tuple{&a.o, &b.o, "O"}, {&a.lse, &b.lse, "LSE"}, {&a.dq, &b.dq, "dQ"},
                                   {&a.dk, &b.dk, "dK"}, {&a.dv, &b.dv, "dV"}}) {
    ASSERT_EQ(x->shape, y->shape) << name;
    for (size_t i = 0; i < x->size(); ++i) ASSERT_NEAR(x->data[i], y->data[i], 1e-6 * (1 + std::fabs(x->data[i]))) << name << " " << i;
  }
  Problem wide = p;
  wide.d = 72;
  EXPECT_NE(padded.unsupported(wide, "").find("compiled for d = 64"), std::string::npos) << padded.unsupported(wide, "");
  wide.d = 36;
  EXPECT_NE(padded.unsupported(wide, "").find("a multiple of 8"), std::string::npos);
}

// Every GPU stage declares what it runs at the new head dims (and step 6, which tunes only 64 and 128, refuses them).
TEST(GridDeclarations, PaddedHeadDimsAgreeWithRefusals) {
  for (const DimCase& k : cases()) expect_declarations_agree(dim_problem(k), [](const Stage&) { return true; });
  Problem p = dim_problem(cases()[0]);
  EXPECT_NE(find_stage("step6_autotune").unsupported(p, "").find("step 6 tunes the compiled head dims"), std::string::npos);
}

}  // namespace
}  // namespace fa::grid
