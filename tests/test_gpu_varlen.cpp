// FlashAttention, step by step — packed variable-length batches on the GPU (tests/test_gpu_varlen.cpp).
//
// Step 4g (packed_batch.h): a packed batch through 4f's kernel in one launch, against step 1 run sequence by
// sequence (core/varlen.h's oracle) under the FlashAttention rule: empty sequences and sequences of one token,
// a tile's tail, sequences of no keys (their rows: O = 0, LSE = -inf), more queries than keys (causal: the top
// rows see nothing), GQA and MQA, the window, ALiBi, the softcap (scores far beyond it) and both, bf16 and fp16,
// d = 64 and 128, at the tiles of both defaults. Each run launches twice, the second time over poisoned
// outputs, so every element is written by every launch. The scheduler's test counts the K/V tiles the blocks
// walk against brute force: the (query tile, key tile) pairs of each sequence that hold a visible pair. The
// backward: step 5's kernels over the packed rows (packed_rows.h), whose gradients repeat bit for bit, after
// 4g's forward or step 7e's (7c's kernel over the offsets), against step 1 the same way; 7e's forward on the
// batches above. The zero-copy path (Stage::run_device) gives the
// Runners' bits.
#include <cstring>
#include <tuple>

#include "core/dtype.h"
#include "core/score_mod.h"
#include "core/varlen.h"
#include "gpu/gpu_runner.h"
#include "gpu_grid.h"
#include "harness/eval.h"
#include "step4_fused_pipelined/configs.h"
#include "step4_fused_pipelined/fused.h"

namespace fa::grid {
namespace {

struct PackedCase {
  std::vector<int64_t> lq, lk;  // the sequences' lengths
  int64_t Hq, Hkv, d;
  bool causal;
  DType dtype;
  std::string mods;     // "", "window", "alibi", "softcap", "alibi+softcap"
  std::string variant;  // step 4's: "auto", "sm120" (the 99 KB tiles, forced)
};

std::string packed_name(const PackedCase& c) {
  std::string n = "q";
  for (int64_t l : c.lq) n += "_" + std::to_string(l);
  n += "_k";
  for (int64_t l : c.lk) n += "_" + std::to_string(l);
  n += "_h" + std::to_string(c.Hq) + "x" + std::to_string(c.Hkv) + "_d" + std::to_string(c.d) + (c.causal ? "_causal" : "") +
       "_" + dtype_name(c.dtype) + (c.mods.empty() ? "" : "_" + c.mods) + "_" + c.variant;
  return n;
}

// The problem as the harness makes it for a packed batch (harness/cli.cpp, run_varlen).
Problem packed_problem(const PackedCase& c, const Varlen& v) {
  Problem p;
  p.B = v.batch(), p.Hq = c.Hq, p.Hkv = c.Hkv, p.d = c.d, p.Nq = v.max_seqlen_q, p.Nk = v.max_seqlen_k;
  p.input_pos = p.Nk - p.Nq;
  p.causal = c.causal, p.dtype = c.dtype;
  p.scale = float(1.0 / std::sqrt(double(c.d)));
  p.seed = std::hash<std::string>{}(packed_name(c));
  if (c.mods == "window") p.window_left = 37, p.window_right = c.causal ? 0 : 20;
  if (c.mods.find("alibi") != std::string::npos) p.alibi = true;
  if (c.mods.find("softcap") != std::string::npos) p.softcap = 0.5f;  // scores of ~ +-3 raw: far beyond the cap
  validate_varlen_problem(p, v);
  return p;
}

std::vector<PackedCase> cases() {
  std::vector<PackedCase> out;
  const std::vector<int64_t> self = {0, 1, 17, 300, 64, 129, 1000};  // Lq = Lk
  const std::vector<int64_t> cross_q = {5, 0, 200, 64, 7}, cross_k = {300, 10, 0, 64, 3};  // no keys; Lq > Lk
  for (int64_t d : {64, 128})
    for (const char* variant : {"auto", "sm120"}) {
      if (d == 64 && std::string(variant) == "sm120") continue;  // the same tiles as auto at d = 64
      out.push_back({self, self, 8, 2, d, true, DType::bf16, "", variant});
      out.push_back({self, self, 8, 2, d, false, DType::fp16, "", variant});
      out.push_back({cross_q, cross_k, 4, 4, d, true, DType::bf16, "", variant});
      out.push_back({cross_q, cross_k, 8, 1, d, false, DType::bf16, "", variant});
      out.push_back({self, self, 8, 2, d, true, DType::bf16, "window", variant});
      out.push_back({self, self, 4, 2, d, false, DType::fp16, "window", variant});
      out.push_back({cross_q, cross_k, 8, 2, d, true, DType::bf16, "alibi", variant});
      out.push_back({self, self, 8, 2, d, true, DType::bf16, "softcap", variant});
      out.push_back({self, self, 8, 8, d, true, DType::fp16, "alibi+softcap", variant});
    }
  return out;
}

class GpuVarlen : public ::testing::TestWithParam<PackedCase> {};

// Stage `spec` ("name:variant") on case c's packed batch, launched twice (the second time over poisoned outputs).
void check_packed_forward(const PackedCase& c, const std::string& spec) {
  const Varlen v = varlen_from_lengths(c.lq, c.lk);
  const Problem p = packed_problem(c, v);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(spec, s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(s->has_varlen && s->make_varlen);
  const Inputs in = random_packed_inputs(p, v);
  auto runner = make_varlen_runner(*s, p, v, in, variant);
  runner->run();
  auto* gpu = dynamic_cast<GpuRunner*>(runner.get());
  ASSERT_NE(gpu, nullptr);
  gpu->poison_outputs();
  runner->run();
  const Outputs out = runner->outputs();
  ASSERT_EQ(out.o.shape, (std::vector<int64_t>{v.total_q(), p.Hq, p.d}));
  ASSERT_EQ(out.lse.shape, (std::vector<int64_t>{p.Hq, v.total_q()}));
  expect_pass(check_against(varlen_oracle(reference_oracle(), v), p, in, out));
  // A row that sees no key: O = 0 and LSE = -inf (the convention, core/varlen.h), written, not left poisoned.
  for (int64_t row = 0; row < v.total_q(); ++row)
    if (!packed_row_sees_a_key(p, v, row))
      for (int64_t h = 0; h < p.Hq; ++h) {
        EXPECT_EQ(out.lse.data[size_t(h * v.total_q() + row)], -INFINITY) << "row " << row << " head " << h;
        EXPECT_EQ(out.o.data[size_t((row * p.Hq + h) * p.d)], 0.0f) << "row " << row << " head " << h;
      }
}

TEST_P(GpuVarlen, MatchesEachSequenceOnStep1) { check_packed_forward(GetParam(), "step4_fused_pipelined:" + GetParam().variant); }

INSTANTIATE_TEST_SUITE_P(Step4, GpuVarlen, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PackedCase>& info) { return param_name(packed_name(info.param)); });

// Step 7e: the same batches (those without score modifiers: step 7 takes none) through 7c's kernel.
class GpuVarlenStep7 : public ::testing::TestWithParam<PackedCase> {};

TEST_P(GpuVarlenStep7, MatchesEachSequenceOnStep1) {
  if (std::none_of(stages().begin(), stages().end(), [](const Stage& st) { return st.name == "step7_hopper_wgmma"; }))
    GTEST_SKIP() << "step 7 is not built (only for sm_90)";
  check_packed_forward(GetParam(), "step7_hopper_wgmma:" + GetParam().variant);
}

std::vector<PackedCase> step7_cases() {
  std::vector<PackedCase> out;
  for (PackedCase c : cases())
    if (c.mods.empty() && c.variant == "auto") {
      out.push_back(c);
      c.variant = "7c-pingpong";
      if (c.d == 128) out.push_back(c);
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Step7, GpuVarlenStep7, ::testing::ValuesIn(step7_cases()),
                         [](const ::testing::TestParamInfo<PackedCase>& info) { return param_name(packed_name(info.param)); });

// The backward of a packed batch: step 5's deterministic kernels over the packed rows (packed_rows.h), and
// step 7 (7e's forward, then the same kernels). O, LSE, dQ, dK and dV against step 1 under the rule
// (every element written: the gradients start poisoned); step 5's gradients repeat bit for bit.
struct BwdCase {
  std::string stage;
  PackedCase c;
};
class GpuVarlenBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(GpuVarlenBackward, MatchesStep1AndRepeats) {
  const BwdCase& bc = GetParam();
  const Varlen v = varlen_from_lengths(bc.c.lq, bc.c.lk);
  Problem p = packed_problem(bc.c, v);
  p.backward = true;
  if (std::none_of(stages().begin(), stages().end(), [&](const Stage& st) { return st.name == bc.stage; }))
    GTEST_SKIP() << bc.stage << " is not built (step 7: only for sm_90)";
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(bc.stage, s, variant); !why.empty()) GTEST_SKIP() << why;
  variant = s->variants.front();  // the default, as the command line runs it
  const Inputs in = random_packed_inputs(p, v);
  auto runner = make_varlen_runner(*s, p, v, in, variant);
  runner->run();
  runner->run_backward();
  const Outputs first = runner->outputs();
  expect_pass(check_against(varlen_oracle(reference_oracle(), v), p, in, first));
  if (bc.stage != "step5_backward") return;
  runner->run_backward();
  const Outputs again = runner->outputs();
  for (const auto& [a, b, name] : {std::tuple{&first.dq, &again.dq, "dQ"}, {&first.dk, &again.dk, "dK"}, {&first.dv, &again.dv, "dV"}})
    EXPECT_EQ(0, std::memcmp(a->data.data(), b->data.data(), a->data.size() * sizeof(float))) << name << " differs run to run";
}

std::vector<BwdCase> backward_cases() {
  const std::vector<int64_t> self = {0, 1, 17, 300, 129, 64};
  const std::vector<int64_t> cross_q = {5, 0, 200, 64, 7}, cross_k = {300, 10, 0, 64, 3};
  std::vector<BwdCase> out;
  for (int64_t d : {64, 128}) {
    out.push_back({"step5_backward", {self, self, 8, 2, d, true, DType::bf16, "", ""}});
    out.push_back({"step5_backward", {self, self, 8, 2, d, false, DType::fp16, "", ""}});
    out.push_back({"step5_backward", {cross_q, cross_k, 4, 4, d, true, DType::bf16, "", ""}});
    out.push_back({"step5_backward", {cross_q, cross_k, 8, 1, d, false, DType::bf16, "", ""}});
    out.push_back({"step5_backward", {self, self, 8, 2, d, true, DType::bf16, "window", ""}});
    out.push_back({"step5_backward", {self, self, 8, 2, d, true, DType::fp16, "alibi+softcap", ""}});
    out.push_back({"step7_hopper_wgmma", {self, self, 8, 2, d, d == 128, DType::bf16, "", ""}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Steps5And7, GpuVarlenBackward, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<BwdCase>& info) {
                           return param_name(info.param.stage + "_" + packed_name(info.param.c));
                         });

// The zero-copy path (Stage::run_device; the C interface's device calls): step 5's forward (4g) or step 7's (7e)
// and step 5's packed backward on tensors the test uploaded itself, the outputs poisoned first, give the bits of
// the same kernels run through the stage's Runner (whose backward starts from its own forward's O and LSE, as
// run_device's is given them).
struct ZeroCopyCase {
  std::string stage, variant;  // step 5 (4g's forward) or step 7 (7e's), and the variant both paths run
  PackedCase c;
};
class GpuZeroCopy : public ::testing::TestWithParam<ZeroCopyCase> {};

TEST_P(GpuZeroCopy, GivesTheRunnersBits) {
  const PackedCase& c = GetParam().c;
  const std::string& variant = GetParam().variant;
  const Varlen v = varlen_from_lengths(c.lq, c.lk);
  Problem p = packed_problem(c, v);
  p.backward = true;
  const std::string& stage = GetParam().stage;
  if (std::none_of(stages().begin(), stages().end(), [&](const Stage& st) { return st.name == stage; }))
    GTEST_SKIP() << stage << " is not built (step 7: only for sm_90)";
  const Stage* s = nullptr;
  std::string default_variant;
  if (const std::string why = resolve(stage, s, default_variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(bool(s->run_device));
  const Inputs in = random_packed_inputs(p, v);
  auto runner = make_varlen_runner(*s, p, v, in, variant);
  runner->run();
  runner->run_backward();
  const Outputs want = runner->outputs();

  DeviceBuffer q = upload(in.q, p.dtype), k = upload(in.k, p.dtype), vv = upload(in.v, p.dtype), dout = upload(in.dout, p.dtype);
  const size_t es = size_t(dtype_bytes(p.dtype));
  DeviceBuffer o(in.q.size() * es), lse(size_t(p.Hq * v.total_q()) * sizeof(float)), dq(in.q.size() * es),
      dk(in.k.size() * es), dv(in.v.size() * es);
  for (DeviceBuffer* b : {&o, &lse, &dq, &dk, &dv}) b->poison();
  const DeviceBatch t{q.get(), k.get(), vv.get(), o.get(), lse.as<float>(), dout.get(), dq.get(), dk.get(), dv.get()};
  Problem fwd = p;
  fwd.backward = false;
  ASSERT_EQ(s->run_device(fwd, v, t, variant), "");
  ASSERT_EQ(s->run_device(p, v, t, variant), "");
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int64_t> qs = {v.total_q(), p.Hq, p.d}, ks = {v.total_k(), p.Hkv, p.d};
  for (const auto& [got, w, name] : {std::tuple{download(o, p.dtype, qs), &want.o, "O"},
                                     {download_f32(lse, {p.Hq, v.total_q()}), &want.lse, "LSE"},
                                     {download(dq, p.dtype, qs), &want.dq, "dQ"},
                                     {download(dk, p.dtype, ks), &want.dk, "dK"},
                                     {download(dv, p.dtype, ks), &want.dv, "dV"}})
    EXPECT_EQ(0, std::memcmp(got.data.data(), w->data.data(), got.data.size() * sizeof(float))) << name;
  // What it leaves to the copy path: another head dim, the score modifiers, another variant, no keys at all.
  Problem d96 = p, mods = p;
  d96.d = 96;
  mods.softcap = 0.5f;
  Problem fwd96 = fwd, fwd_mods = fwd;
  fwd96.d = 96;
  fwd_mods.softcap = 0.5f;
  for (const Problem* other : {&d96, &mods, &fwd96, &fwd_mods}) EXPECT_NE(s->run_device(*other, v, t, variant), "");
  if (stage == "step5_backward") EXPECT_NE(s->run_device(p, v, t, "atomic"), "");  // not the packed kernels
  else EXPECT_NE(s->run_device(fwd, v, t, "7a-wgmma"), "");                       // not 7e
  EXPECT_NE(s->run_device(fwd, varlen_from_lengths({3}, {0}), t, variant), "");
}

std::vector<ZeroCopyCase> zero_copy_cases() {
  const std::vector<int64_t> self = {1, 17, 300, 129, 64}, cross_q = {5, 0, 200, 64, 7}, cross_k = {300, 10, 0, 64, 3};
  std::vector<ZeroCopyCase> out;
  for (const auto& [stage, variant] : {std::pair<std::string, std::string>{"step5_backward", "deterministic"},
                                       {"step7_hopper_wgmma", "auto"}})
    for (int64_t d : {64, 128}) {
      out.push_back({stage, variant, {self, self, 8, 2, d, true, DType::bf16, "", "auto"}});
      out.push_back({stage, variant, {cross_q, cross_k, 4, 4, d, false, DType::fp16, "", "auto"}});
      out.push_back({stage, variant, {{256, 256, 256}, {256, 256, 256}, 4, 1, d, true, DType::bf16, "", "auto"}});  // dense
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Steps5And7, GpuZeroCopy, ::testing::ValuesIn(zero_copy_cases()),
                         [](const ::testing::TestParamInfo<ZeroCopyCase>& info) {
                           return param_name(info.param.stage + "_" + packed_name(info.param.c));
                         });

// The K/V tiles a packed batch's blocks walk, by brute force: for each sequence, head and query tile of Br
// rows, the key tiles of Bc keys where some row of the tile sees some key (core/score_mod.h, visible_range).
int64_t tiles_with_a_visible_pair(const Problem& p, const Varlen& v, int64_t Br, int64_t Bc) {
  int64_t n = 0;
  for (int64_t b = 0; b < v.batch(); ++b) {
    const Problem s = sequence_problem(p, v, b);
    const ScoreMod m = score_mod_of(s);
    for (int64_t m0 = 0; m0 < s.Nq; m0 += Br)
      for (int64_t k0 = 0; k0 < s.Nk; k0 += Bc) {
        bool seen = false;
        for (int64_t i = m0; i < std::min(m0 + Br, s.Nq) && !seen; ++i) {
          int64_t lo = 0, hi = -1;
          visible_range(m, s.Nk, i, &lo, &hi);
          seen = lo <= hi && lo < k0 + Bc && hi >= k0;
        }
        n += seen ? p.Hq : 0;
      }
  }
  return n;
}

class GpuVarlenScheduler : public ::testing::TestWithParam<int64_t> {};

TEST_P(GpuVarlenScheduler, WalksExactlyTheTilesWithAVisiblePair) {
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve("step4_fused_pipelined:sm90", s, variant); !why.empty()) GTEST_SKIP() << why;
  const int64_t d = GetParam();
  {
    for (const char* mods : {"", "window"})
      for (bool causal : {false, true})
        for (const char* forced : {"sm90", "sm120"}) {
          const PackedCase c{{0, 1, 17, 300, 64, 129, 1000, 5}, {0, 1, 17, 300, 64, 129, 1000, 900}, 4, 2, d, causal,
                             DType::bf16, mods, forced};
          const Varlen v = varlen_from_lengths(c.lq, c.lk);
          const Problem p = packed_problem(c, v);
          const step4::FwdTiles t = std::string(forced) == "sm90"
                                 ? (d == 64 ? step4::Configs<__nv_bfloat16, 64>::kSm90 : step4::Configs<__nv_bfloat16, 128>::kSm90)
                                 : (d == 64 ? step4::Configs<__nv_bfloat16, 64>::kSm120 : step4::Configs<__nv_bfloat16, 128>::kSm120);
          EXPECT_EQ(step4::packed_tiles_walked(p, v, random_packed_inputs(p, v), forced), tiles_with_a_visible_pair(p, v, t.Br, t.Bc))
              << packed_name(c);
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Step4, GpuVarlenScheduler, ::testing::Values(64, 128));

// ---- host-side (no GPU: they run in CI) ----

// What step 4 refuses in a packed batch, with the reason: a variant that is not at the defaults' tiles is
// refused when the runner is made (on a GPU); here, what needs no GPU: step 4 declares the varlen path, and
// the harness's own refusals (core/varlen.h) hold for it as for the CPU stages.
TEST(VarlenDeclarations, Step4RunsTheForwardOfAPackedBatch) {
  const Stage& s = find_stage("step4_fused_pipelined");
  EXPECT_TRUE(s.has_varlen);
  EXPECT_TRUE(bool(s.make_varlen));
  EXPECT_FALSE(find_stage("step3_naive_kernel").has_varlen);
  EXPECT_TRUE(find_stage("step5_backward").has_varlen && find_stage("step5_backward").make_varlen);  // its own kernels
  for (const Stage& st : stages())  // step 7 (where built): 7e's kernel
    if (st.name == "step7_hopper_wgmma") EXPECT_TRUE(st.has_varlen && st.make_varlen) << st.name;  // 7e
  for (const Stage& st : stages())  // the zero-copy path: steps 4, 5 and 7
    EXPECT_EQ(bool(st.run_device), st.name == "step4_fused_pipelined" || st.name == "step5_backward" ||
                                       st.name == "step7_hopper_wgmma")
        << st.name;
  const Varlen v = varlen_from_lengths({3, 4}, {3, 4});
  Problem p = packed_problem({{3, 4}, {3, 4}, 4, 2, 64, true, DType::bf16, "", "auto"}, v);
  p.dropout = 0.1f;
  EXPECT_THROW(make_varlen_runner(s, p, v, random_packed_inputs(p, v), "auto"), std::invalid_argument);
}

}  // namespace
}  // namespace fa::grid
