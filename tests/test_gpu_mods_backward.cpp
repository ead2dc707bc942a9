// FlashAttention, step by step — the GPU backward with score modifiers (core/score_mod.h) against step 1.
//
// Every GPU stage that owns backward kernels and takes score modifiers (step 5: deterministic, atomic,
// atomic-sm120), on named cases: each modifier alone (a bias of every broadcast shape, ALiBi with the
// standard and with given slopes, GQA, a softcap, sliding windows with and without the causal mask, with
// Nq != Nk and an explicit input_pos), and combinations (softcap + dropout, bias + causal + window with a
// broadcast and with a full bias, all of them), each at d = 64 and d = 128, bf16 and fp16, lengths that
// are no multiple of the tiles. A run checks O, LSE, dQ, dK, dV and, with a bias, dBias under the
// tolerance rule (core/metrics.h), every element written. A second test runs the backward twice and wants
// the same bits: dQ, dK, dV and a broadcast bias's dBias from the deterministic variant, a full bias's
// dBias from the atomic ones (they add a broadcast bias's dBias with atomics, as their dQ). A variant is
// listed on the cases it declares (core/stage.h, Supports), so a refusal fails; without a CUDA device every
// case is skipped with the reason.
#include <cstring>
#include <random>

#include "gpu_grid.h"

namespace fa::grid {
namespace {

struct ModCase {
  std::string name;
  Case base;              // shapes, causal, input_pos, dropout; d and dtype are set per instance
  int64_t bias_b, bias_h;  // the bias's leading dims (1: broadcast over B / Hq); 0: no bias
  bool alibi;
  bool given_slopes;       // with alibi: slopes given as an input instead of the standard series
  float softcap;
  int64_t wl, wr;          // sliding window (left, right); -1: unbounded
};

// The named cases, each at d = 64 (bf16) and d = 128 (fp16), or the other way round (alternating).
std::vector<ModCase> cases() {
  const int64_t B = 2, N = kDefaultPos;
  const DType bf = DType::bf16;
  // clang-format off
  const std::vector<ModCase> base = {
      // name                  B  Hq Hkv  Nq   Nk  d  causal pos  dtype dropout      bias_b bias_h alibi given softcap  wl   wr
      {"bias_full",           {B, 4, 2,  200, 200, 64, false, N, bf, 0.0f},        B, 4, false, false, 0.0f, -1, -1},
      {"bias_over_batch",     {B, 4, 2,  200, 200, 64, false, N, bf, 0.0f},        1, 4, false, false, 0.0f, -1, -1},
      {"bias_over_heads",     {B, 4, 2,  150, 230, 64, true,  N, bf, 0.0f},        B, 1, false, false, 0.0f, -1, -1},
      {"bias_over_both",      {B, 4, 4,  129, 129, 64, false, N, bf, 0.0f},        1, 1, false, false, 0.0f, -1, -1},
      {"alibi",               {B, 4, 4,  150, 150, 64, false, N, bf, 0.0f},        0, 0, true,  false, 0.0f, -1, -1},
      {"alibi_gqa_causal",    {1, 6, 2,  300, 300, 64, true,  N, bf, 0.0f},        0, 0, true,  false, 0.0f, -1, -1},
      {"alibi_gqa_given",     {B, 8, 2,  100, 170, 64, false, N, bf, 0.0f},        0, 0, true,  true,  0.0f, -1, -1},
      {"softcap",             {B, 4, 4,  200, 200, 64, false, N, bf, 0.0f},        0, 0, false, false, 2.0f, -1, -1},
      {"window",              {B, 4, 2,  300, 300, 64, false, N, bf, 0.0f},        0, 0, false, false, 0.0f, 30, 20},
      {"window_left_only",    {1, 4, 4,  300, 300, 64, false, N, bf, 0.0f},        0, 0, false, false, 0.0f, 45, -1},
      {"window_right_only",   {1, 4, 4,  300, 300, 64, false, N, bf, 0.0f},        0, 0, false, false, 0.0f, -1, 17},
      {"window_causal",       {B, 4, 2,  300, 300, 64, true,  N, bf, 0.0f},        0, 0, false, false, 0.0f, 40, 7},
      {"window_kv_cache",     {B, 4, 2,   77, 250, 64, true,  N, bf, 0.0f},        0, 0, false, false, 0.0f, 33, -1},
      {"window_input_pos",    {1, 4, 4,  100, 300, 64, false, 50, bf, 0.0f},       0, 0, false, false, 0.0f, 25, 10},
      {"window_neg_pos",      {1, 4, 2,  200, 130, 64, true,  -20, bf, 0.0f},      0, 0, false, false, 0.0f, 60, -1},
      {"softcap_dropout",     {B, 4, 2,  200, 200, 64, true,  N, bf, 0.15f},       0, 0, false, false, 2.0f, -1, -1},
      // scores N(~0.8, 1.1) against a cap of 0.25: most far beyond it, where tanh saturates (its derivative
      // is then tiny, and only a form that keeps its digits there passes: core/score_mod.h, softcap_grad_pre)
      {"softcap_saturated",   {B, 4, 2,  200, 200, 64, false, N, bf, 0.0f},        0, 0, false, false, 0.25f, -1, -1},
      {"softcap_sat_dropout", {B, 4, 2,  190, 230, 64, true,  N, bf, 0.15f},       0, 0, false, false, 0.25f, -1, -1},
      {"softcap_sat_bias",    {B, 4, 2,  170, 170, 64, true,  N, bf, 0.0f},        B, 4, false, false, 0.5f, -1, -1},
      {"bias_causal_window",  {B, 4, 2,  250, 250, 64, true,  N, bf, 0.0f},        B, 1, false, false, 0.0f, 64, -1},
      {"all",                 {B, 4, 2,  180, 210, 64, true,  N, bf, 0.1f},        1, 4, true,  false, 5.0f, 50, -1},
      {"bias_full_window",    {B, 4, 2,  230, 260, 64, true,  N, bf, 0.0f},        B, 4, false, false, 0.0f, 40, -1},
  };
  // clang-format on
  std::vector<ModCase> out;
  for (size_t k = 0; k < base.size(); ++k)
    for (int64_t d : {64, 128}) {
      ModCase x = base[k];
      x.base.d = d;
      x.base.dtype = (d == 64) == (k % 2 == 0) ? DType::bf16 : DType::fp16;
      x.name += "_d" + std::to_string(d) + "_" + dtype_name(x.base.dtype);
      out.push_back(x);
    }
  return out;
}

// Readable test parameters in gtest's output.
void PrintTo(const ModCase& c, std::ostream* os) { *os << c.name << " " << case_name(c.base); }

// The problem of a case; with `in`, its inputs too: random Q, K, V, dO as in the backward grid, a random bias
// (N(0, 1), about one entry in 16 set to -inf: a mask given as a bias), given slopes where asked.
Problem to_problem(const ModCase& c) {
  Problem p = grid::to_problem(c.base, /*backward=*/true);
  p.bias = c.bias_b > 0;
  p.alibi = c.alibi;
  p.softcap = c.softcap;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.seed = std::hash<std::string>{}(c.name) & 0xffff;
  p.validate();
  return p;
}
Problem to_problem(const ModCase& c, Inputs& in) {
  const Problem p = to_problem(c);
  in = random_inputs(p);
  std::mt19937_64 rng(p.seed);
  if (p.bias) {
    in.bias = random_tensor({c.bias_b, c.bias_h, p.Nq, p.Nk}, p.seed, 9, 0.0f, DType::fp32);
    for (float& x : in.bias.data)
      if (rng() % 16 == 0) x = -INFINITY;
  }
  if (p.alibi && c.given_slopes) {
    in.alibi_slopes = Tensor({p.Hq});
    for (float& x : in.alibi_slopes.data) x = float(1 + rng() % 100) / 100.0f;
  }
  return p;
}

// ("stage:variant", case) for every GPU stage with backward kernels of its own and score modifiers, every
// variant of it that declares the case (core/stage.h, Supports), less those that run the same configuration
// as an earlier variant on this GPU.
std::vector<std::tuple<std::string, ModCase>> entries() {
  std::vector<std::tuple<std::string, ModCase>> out;
  const int cc = grid_cc_major();
  for (const Stage& s : stages()) {
    if (!s.gpu() || !s.has_backward || !s.backward_from.empty() || !s.has_score_mods) continue;
    for (const ModCase& c : cases()) {
      const Problem p = to_problem(c);
      std::vector<std::string> seen;
      for (const std::string& v : s.variants) {
        if (!declares(s, p, v)) continue;
        if (s.config_of) {
          const std::string config = s.config_of(grid::to_problem(c.base, true), v, cc);
          if (std::find(seen.begin(), seen.end(), config) != seen.end()) continue;
          seen.push_back(config);
        }
        out.emplace_back(s.name + ":" + v, c);
      }
    }
  }
  return out;
}

using Param = std::tuple<std::string, ModCase>;

class GpuModsBackward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuModsBackward, MatchesReference) {
  const auto& [stage_variant, c] = GetParam();
  Inputs in;
  const Problem p = to_problem(c, in);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*s, p, variant), "");

  auto runner = s->make(p, in, variant);
  runner->run();
  runner->run_backward();
  const Outputs out = runner->outputs();
  const CheckReport r = check_against_reference(p, in, out);
  ASSERT_EQ(r.n, p.bias ? 6 : 5);
  if (p.bias) {
    EXPECT_EQ(out.dbias.shape, in.bias.shape);
  }
  expect_pass(r);
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuModsBackward, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return param_name(std::get<0>(info.param) + "_" + std::get<1>(info.param).name);
                         });

// Two backward runs on the same forward give the same bits: outside the atomic variants dQ, dK, dV and the
// dBias of a bias broadcast over the batch (each element has one writer, and the broadcast is summed in a
// fixed order); in the atomic ones, which add dQ, and a broadcast bias's dBias, with atomics in whatever
// order the blocks come, only the dBias of a full bias (one writer per element).
class GpuModsBackwardDeterminism : public ::testing::TestWithParam<std::string> {};

// The case at head dim d; the atomic variants take a full bias [B, Hq, Nq, Nk], the others one over the batch.
ModCase determinism_case(int64_t d, bool atomic) {
  return {"determinism", {2, 8, 2, 300, 257, d, true, kDefaultPos, DType::bf16, 0.1f}, atomic ? 2 : 1, 8, true, false,
          10.0f, 70, -1};
}

TEST_P(GpuModsBackwardDeterminism, TwoRunsSameBits) {
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(GetParam(), s, variant); !why.empty()) GTEST_SKIP() << why;
  const bool atomic = GetParam().find(":atomic") != std::string::npos;
  // Each head dim the variant declares, whatever happens to the other: a refusal fails that d alone.
  int declared = 0;
  for (int64_t d : {64, 128}) {
    Inputs in;
    const Problem p = to_problem(determinism_case(d, atomic), in);
    if (!declares(*s, p, variant)) continue;
    ++declared;
    if (const std::string why = refusal(*s, p, variant); !why.empty()) {
      ADD_FAILURE() << why;
      continue;
    }
    auto runner = s->make(p, in, variant);
    expect_backward_repeats(*runner, atomic ? 3 : 0, 4, d);  // dBias (and dQ, dK, dV where deterministic)
  }
  EXPECT_GT(declared, 0) << "listed, so it declares at least one head dim";
}

// The variants of the stages above that declare the case at some head dim.
std::vector<std::string> determinism_entries() {
  std::vector<std::string> out;
  for (const std::string& sv : stage_variants(
           [](const Stage& s) { return s.has_backward && s.backward_from.empty() && s.has_score_mods; },
           [](const std::string&) { return true; })) {
    const size_t colon = sv.find(':');
    const Stage& s = find_stage(sv.substr(0, colon));
    const std::string v = colon == std::string::npos ? "" : sv.substr(colon + 1);
    const bool atomic = sv.find(":atomic") != std::string::npos;
    for (int64_t d : {64, 128}) {
      if (declares(s, to_problem(determinism_case(d, atomic)), v)) {
        out.push_back(sv);
        break;
      }
    }
  }
  return out;
}

// Host-side (no GPU: it runs in CI): on every case above, each GPU stage declares exactly what its
// unsupported() accepts.
TEST(GridDeclarations, ModsBackwardCasesAgreeWithRefusals) {
  std::vector<ModCase> cs = cases();
  for (int64_t d : {64, 128})
    for (bool atomic : {false, true}) cs.push_back(determinism_case(d, atomic));
  for (const ModCase& c : cs) expect_declarations_agree(to_problem(c), [](const Stage&) { return true; });
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuModsBackwardDeterminism, ::testing::ValuesIn(determinism_entries()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return param_name(info.param); });

}  // namespace
}  // namespace fa::grid
