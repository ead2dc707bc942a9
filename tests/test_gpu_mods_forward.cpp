// FlashAttention, step by step — the score modifiers of the GPU forward against step 1
// (tests/test_gpu_mods_forward.cpp).
//
// Every GPU stage that owns forward kernels (step 3's naive kernel, step 4's variants auto, sm90 and sm120
// as the grid resolves them, and step 4's split-KV path 4f with --splits, packed GQA included) on problems
// with the score modifiers of core/score_mod.h: a bias of each broadcast shape (random, with -inf entries,
// a row the bias masks wholly and a row whose leading tiles it masks), ALiBi with the standard slopes and
// with given ones, a softcap with and without dropout, sliding windows (non-causal, with causal, with
// Nq != Nk and explicit input_pos, negative included) and their combinations; d 64 and 128, bf16 and fp16,
// lengths that are not multiples of 64 or 128, and decode shapes. O and LSE are checked against step 1 in
// fp64 under the FlashAttention rule (core/metrics.h), every element written.
//
// GpuModsConfigs runs every configuration of step 4 whose kernels have the modifiers (kHasMods) on one
// modifier case, and checks that the others (the chapter's lessons) refuse them with the reason.
// Step4ScoreMods (no GPU needed) checks those refusals, and the command line's, on the host.
// Without a CUDA device every Gpu case is skipped with the reason.
#include <cmath>
#include <optional>
#include <random>

#include "gpu_grid.h"
#include "step4_fused_pipelined/configs.h"
#include "tests/cli_run.h"

namespace fa::grid {
namespace {

struct ModCase {
  Case c;
  const char* bias;  // "": none; "BH", "1H", "B1", "11": its shape [B|1, Hq|1, Nq, Nk]
  int alibi;         // 0: off; 1: the standard slopes; 2: given slopes (Inputs::alibi_slopes)
  float softcap;     // 0: off
  int64_t wl, wr;    // the window; -1, -1: none
  int64_t splits;    // step 4's --splits (0: chosen from the shape)
};

std::string mods_name(const ModCase& m) {
  std::string n = case_name(m.c);
  if (!m.c.causal && m.c.input_pos != kDefaultPos) n += "_pos" + std::to_string(m.c.input_pos);
  if (*m.bias) n += std::string("_bias") + m.bias;
  if (m.alibi) n += m.alibi == 1 ? "_alibi" : "_alibigiven";
  if (m.softcap >= 1) n += "_softcap" + std::to_string(int(m.softcap));
  else if (m.softcap > 0) n += "_softcap0p" + std::to_string(int(m.softcap * 100));  // 0.25: "0p25"
  if (m.wl >= 0 || m.wr >= 0) n += "_win" + std::to_string(m.wl) + "_" + std::to_string(m.wr);
  if (m.splits > 0) n += "_splits" + std::to_string(m.splits);
  std::replace(n.begin(), n.end(), '-', 'm');
  return n;
}

void PrintTo(const ModCase& m, std::ostream* os) { *os << mods_name(m); }

Problem mods_problem(const ModCase& m) {
  Problem p = to_problem(m.c, /*backward=*/false);
  p.bias = *m.bias != '\0';
  p.alibi = m.alibi > 0;
  p.softcap = m.softcap;
  p.window_left = m.wl;
  p.window_right = m.wr;
  p.splits = m.splits;
  p.seed = std::hash<std::string>{}(mods_name(m)) & 0xffff;  // every case its own inputs
  p.validate();
  return p;
}

// Q, K, V as the other grids draw them; the bias N(0, 1) with about one entry in 16 -inf (a mask given as a
// bias), and in every (batch, head) of it row 5 wholly -inf (a fully masked row: O = 0, LSE = -inf) and
// row 7 -inf on its first half of keys (whole tiles masked before the row sees any key: m_i is still -inf
// there); given ALiBi slopes in (0, 0.8].
Inputs mods_inputs(const Problem& p, const ModCase& m) {
  Inputs in = random_inputs(p);
  std::mt19937_64 rng(p.seed);
  if (p.bias) {
    const int64_t bB = m.bias[0] == 'B' ? p.B : 1, bH = m.bias[1] == 'H' ? p.Hq : 1;
    in.bias = random_tensor({bB, bH, p.Nq, p.Nk}, p.seed, 9, 0.0f, DType::fp32);
    for (float& x : in.bias.data)
      if (rng() % 16 == 0) x = -INFINITY;
    for (int64_t bh = 0; bh < bB * bH; ++bh) {
      float* rows = in.bias.data.data() + bh * p.Nq * p.Nk;
      if (p.Nq > 5)
        for (int64_t j = 0; j < p.Nk; ++j) rows[5 * p.Nk + j] = -INFINITY;
      if (p.Nq > 7)
        for (int64_t j = 0; j <= p.Nk / 2; ++j) rows[7 * p.Nk + j] = -INFINITY;
    }
  }
  if (m.alibi == 2) {
    in.alibi_slopes = Tensor({p.Hq});
    for (float& x : in.alibi_slopes.data) x = float(1 + rng() % 100) / 125.0f;
  }
  return in;
}

constexpr float kNoDrop = 0.0f;  // no dropout

std::vector<ModCase> cases() {
  const DType bf = DType::bf16, fp = DType::fp16;
  const int64_t def = kDefaultPos;
  return {
      //  B  Hq Hkv  Nq    Nk    d  causal pos   dtype dropout    bias alibi softcap  wl   wr  splits
      // a bias of each broadcast shape
      {{2, 4, 2, 200, 200, 64, false, def, bf, kNoDrop}, "BH", 0, 0.0f, -1, -1, 0},
      {{2, 4, 4, 130, 257, 128, true, def, fp, kNoDrop}, "1H", 0, 0.0f, -1, -1, 0},    // over B
      {{2, 4, 2, 255, 255, 64, true, def, fp, 0.1f}, "B1", 0, 0.0f, -1, -1, 0},    // over H, dropout
      {{2, 4, 1, 77, 300, 128, false, def, bf, kNoDrop}, "11", 0, 0.0f, -1, -1, 0},    // over both, MQA
      {{1, 8, 8, 129, 129, 64, false, def, fp, kNoDrop}, "1H", 0, 0.0f, -1, -1, 0},
      // ALiBi: the standard slopes (a power of two and 6 heads) and given ones, with GQA
      {{1, 8, 2, 300, 300, 64, true, def, bf, kNoDrop}, "", 1, 0.0f, -1, -1, 0},
      {{2, 6, 2, 129, 129, 128, false, def, fp, kNoDrop}, "", 1, 0.0f, -1, -1, 0},
      {{1, 8, 4, 200, 333, 64, false, def, bf, kNoDrop}, "", 2, 0.0f, -1, -1, 0},
      {{1, 8, 2, 200, 333, 128, true, def, fp, kNoDrop}, "", 2, 0.0f, -1, -1, 0},
      // softcap 30 and 5, with and without dropout
      {{2, 4, 2, 257, 257, 64, false, def, bf, kNoDrop}, "", 0, 30.0f, -1, -1, 0},
      {{1, 4, 4, 300, 300, 128, true, def, fp, kNoDrop}, "", 0, 5.0f, -1, -1, 0},
      {{2, 4, 2, 200, 200, 128, false, def, bf, 0.15f}, "", 0, 30.0f, -1, -1, 0},
      {{1, 4, 1, 257, 257, 64, true, def, fp, 0.1f}, "", 0, 5.0f, -1, -1, 0},
      // softcap 0.25: scores N(~0.8, 1.1), most of them far beyond the cap, where tanh saturates
      {{2, 4, 2, 200, 200, 64, false, def, fp, kNoDrop}, "", 0, 0.25f, -1, -1, 0},
      {{1, 4, 2, 190, 230, 128, true, def, bf, 0.1f}, "", 0, 0.25f, -1, -1, 0},
      // windows, non-causal
      {{2, 4, 2, 300, 300, 64, false, def, bf, kNoDrop}, "", 0, 0.0f, 64, 32, 0},
      {{1, 4, 4, 1000, 1000, 128, false, def, fp, kNoDrop}, "", 0, 0.0f, 100, 0, 0},
      {{1, 4, 4, 130, 130, 64, false, def, bf, kNoDrop}, "", 0, 0.0f, 0, 0, 0},
      {{1, 4, 2, 200, 200, 128, false, def, fp, kNoDrop}, "", 0, 0.0f, -1, 17, 0},
      {{1, 4, 2, 200, 200, 64, false, def, bf, 0.1f}, "", 0, 0.0f, 20, 150, 0},
      // windows with causal (which caps the right side at 0)
      {{1, 4, 2, 1000, 1000, 64, true, def, bf, kNoDrop}, "", 0, 0.0f, 128, -1, 0},
      {{2, 4, 4, 257, 257, 128, true, def, fp, kNoDrop}, "", 0, 0.0f, 33, 5, 0},
      {{1, 4, 2, 300, 300, 64, true, def, bf, 0.1f}, "", 0, 0.0f, 50, 0, 0},
      // windows with Nq != Nk and explicit input_pos (negative: rows that see no key)
      {{1, 4, 2, 100, 500, 64, false, 200, bf, kNoDrop}, "", 0, 0.0f, 40, 10, 0},
      {{1, 4, 4, 100, 300, 128, true, -20, fp, kNoDrop}, "", 0, 0.0f, 30, 0, 0},
      {{2, 4, 2, 200, 129, 64, false, -50, bf, kNoDrop}, "", 0, 0.0f, 16, 16, 0},
      {{2, 4, 4, 300, 100, 128, true, def, fp, kNoDrop}, "", 0, 0.0f, 64, -1, 0},     // Nq > Nk
      {{1, 4, 4, 64, 300, 64, false, 1000, bf, kNoDrop}, "", 0, 0.0f, 10, 10, 0},     // every row past K
      // combinations
      {{2, 4, 2, 300, 300, 64, true, def, bf, kNoDrop}, "B1", 0, 0.0f, 100, 0, 0},
      {{1, 4, 2, 257, 257, 128, true, def, fp, kNoDrop}, "11", 0, 30.0f, 50, 0, 0},
      {{1, 8, 2, 257, 257, 128, false, def, bf, kNoDrop}, "", 1, 0.0f, 64, 64, 0},
      {{1, 8, 4, 100, 400, 64, true, 250, fp, kNoDrop}, "", 2, 0.0f, 32, 0, 0},
      {{2, 4, 2, 129, 200, 128, true, def, bf, 0.1f}, "BH", 1, 20.0f, 40, 8, 0},  // everything at once
      {{2, 4, 2, 17, 300, 64, false, def, fp, kNoDrop}, "1H", 1, 0.0f, -1, -1, 0},    // Nq < 64: step 4 decodes
      {{2, 4, 2, 127, 127, 64, true, def, DType::fp32, kNoDrop}, "BH", 2, 30.0f, 40, 0, 0},  // fp32: step 3 only
  };
}

// Decode shapes (one or a few query rows against a long K/V) with a window, with step 4's splits forced
// (1, 3) and chosen (0); GQA groups are packed into one tile unless dropout is on.
std::vector<ModCase> decode_cases() {
  const DType bf = DType::bf16, fp = DType::fp16;
  const int64_t def = kDefaultPos;
  std::vector<ModCase> out;
  for (int64_t splits : {1, 3, 0}) {
    const std::vector<ModCase> base = {
        {{2, 8, 2, 1, 3000, 64, true, def, bf, kNoDrop}, "", 0, 0.0f, 256, 0, splits},     // group 4, packed
        {{1, 8, 1, 16, 2000, 128, true, def, fp, kNoDrop}, "", 0, 0.0f, 500, 0, splits},   // MQA, packed
        {{2, 4, 4, 16, 1000, 64, false, def, bf, kNoDrop}, "", 1, 0.0f, 100, 20, splits},  // both sides, ALiBi
        {{1, 8, 2, 16, 1500, 128, true, 1000, bf, kNoDrop}, "1H", 0, 30.0f, 300, 0, splits},
        {{1, 8, 2, 4, 1200, 64, false, def, fp, 0.1f}, "", 0, 5.0f, 64, -1, splits},   // dropout: not packed
        {{1, 8, 2, 16, 1000, 64, true, -5, bf, kNoDrop}, "", 2, 0.0f, 8, 0, splits},       // rows 0-4 see nothing
        {{1, 8, 4, 1, 2500, 128, false, def, fp, kNoDrop}, "B1", 1, 0.0f, 1000, 0, splits},
    };
    out.insert(out.end(), base.begin(), base.end());
  }
  return out;
}

using Param = std::tuple<std::string, ModCase>;

// ("stage:variant", case) for every GPU stage that owns forward kernels and takes the modifiers (steps 3
// and 4; step 7 has none), its variants that `keep` accepts and that declare the case (core/stage.h, Supports;
// --splits: step 4's only), less those that run the same configuration as an earlier variant on that case.
std::vector<Param> entries(const std::vector<ModCase>& cs, const std::function<bool(const std::string&)>& keep) {
  std::vector<Param> out;
  const int cc = grid_cc_major();
  for (const Stage& s : stages()) {
    if (!s.gpu() || !s.forward_from.empty() || !s.has_score_mods) continue;
    const std::vector<std::string> variants = s.variants.empty() ? std::vector<std::string>{""} : s.variants;
    for (const ModCase& m : cs) {
      const Problem p = mods_problem(m);
      if (p.splits > 0 && !s.has_splits) continue;
      std::vector<std::string> seen;
      for (const std::string& v : variants) {
        if (!v.empty() && !keep(v)) continue;
        if (!declares(s, p, v)) continue;  // fp32 on step 4; --splits on sm90 and sm120
        if (s.config_of) {
          const std::string config = s.config_of(p, v, cc);
          if (std::find(seen.begin(), seen.end(), config) != seen.end()) continue;
          seen.push_back(config);
        }
        out.emplace_back(v.empty() ? s.name : s.name + ":" + v, m);
      }
    }
  }
  return out;
}

bool user_variant(const std::string& v) { return v == "auto" || v == "sm90" || v == "sm120"; }

std::string param_of(const ::testing::TestParamInfo<Param>& info) {
  return param_name(std::get<0>(info.param) + "_" + mods_name(std::get<1>(info.param)));
}

// Runs `stage_variant` on the case and checks it against step 1. Listed only where the stage declares the
// case, so a refusal here is a failure, not a skip.
void run_and_check(const std::string& stage_variant, const ModCase& m) {
  const Problem p = mods_problem(m);
  const Stage* s = nullptr;
  std::string variant;
  if (const std::string why = resolve(stage_variant, s, variant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(refusal(*s, p, variant), "");
  if (p.splits > 0) {
    EXPECT_TRUE(step4::is_split_kv(s->config_of(p, variant, grid_cc_major()))) << "--splits runs the split-KV kernel";
  }
  const Inputs in = mods_inputs(p, m);
  auto runner = s->make(p, in, variant);
  runner->run();
  const CheckReport r = check_against_reference(p, in, runner->outputs());
  ASSERT_EQ(r.n, 2);
  expect_pass(r);
}

class GpuModsForward : public ::testing::TestWithParam<Param> {};

TEST_P(GpuModsForward, MatchesReference) { run_and_check(std::get<0>(GetParam()), std::get<1>(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Grid, GpuModsForward, ::testing::ValuesIn(entries(cases(), user_variant)), param_of);

class GpuModsDecode : public ::testing::TestWithParam<Param> {};

TEST_P(GpuModsDecode, MatchesReference) { run_and_check(std::get<0>(GetParam()), std::get<1>(GetParam())); }

// Step 4's auto (the split-KV kernel at these shapes) with each number of splits; step 3 on the chosen one.
INSTANTIATE_TEST_SUITE_P(Decode, GpuModsDecode,
                         ::testing::ValuesIn(entries(decode_cases(), [](const std::string& v) { return v == "auto"; })),
                         param_of);

// ---- every configuration of step 4 -------------------------------------------------------------------

// One case with every modifier (a bias broadcast over B with its -inf rows, ALiBi with GQA, a softcap, a
// causal window, Nq != Nk, tails) per head dim.
ModCase config_case(int64_t d) {
  return {{1, 8, 2, 200, 333, d, true, kDefaultPos, d == 64 ? DType::bf16 : DType::fp16, kNoDrop}, "1H", 1, 30.0f, 100, 0, 0};
}

using ConfigParam = std::tuple<std::string, int64_t>;  // configuration, head dim

std::vector<ConfigParam> config_entries() {
  std::vector<ConfigParam> out;
  for (const Stage& s : stages())
    if (s.name == "step4_fused_pipelined")
      for (const std::string& config : s.tuning_variants)
        for (int64_t d : {64, 128}) {
          try {
            s.launch_shape(mods_problem(config_case(d)), config);  // throws for a head dim it does not compile
          } catch (const std::invalid_argument&) {
            continue;
          }
          out.emplace_back(config, d);
        }
  return out;
}

class GpuModsConfigs : public ::testing::TestWithParam<ConfigParam> {};

// Step 4 compiles the modifiers into its TMA kernels with swizzled tiles in the default block order
// (kernel_traits.h: kHasMods): every configuration but the chapter's sub-steps 4a-4c (step 4's
// tuning_exclusion) and the block-order and unswizzled ablations.
bool has_mods(const Stage& s, const std::string& config) {
  const std::optional<step4::FwdTiles> tiles = step4::tiles_named(config);
  const bool unswizzled = tiles && tiles->layout == step4::SmemLayout::kPlain;
  return s.tuning_exclusion(config).empty() && !unswizzled;
}

// A configuration with the modifiers compiled in (the ones a user runs and step 6 tunes) matches step 1;
// one without refuses the case with the reason, host-side.
TEST_P(GpuModsConfigs, MatchesReferenceOrRefuses) {
  const auto& [config, d] = GetParam();
  const Stage& s = find_stage("step4_fused_pipelined");
  const ModCase m = config_case(d);
  const Problem p = mods_problem(m);
  const std::string why = s.unsupported(p, config);
  EXPECT_EQ(declares(s, p, config), has_mods(s, config)) << config << ": the declaration (kHasMods) and the names disagree";
  if (!has_mods(s, config)) {
    EXPECT_NE(why.find("score modifiers run in 4e's and 4f's configurations"), std::string::npos) << config << ": " << why;
    return;
  }
  ASSERT_EQ(why, "") << config;
  run_and_check("step4_fused_pipelined:" + config, m);
}

INSTANTIATE_TEST_SUITE_P(Step4, GpuModsConfigs, ::testing::ValuesIn(config_entries()),
                         [](const ::testing::TestParamInfo<ConfigParam>& info) {
                           return param_name(std::get<0>(info.param) + "_d" + std::to_string(std::get<1>(info.param)));
                         });

// ---- host side: which variants take the modifiers (no GPU needed) --------------------------------------

// On every case of the grids above, each GPU stage declares exactly what its unsupported() accepts, so the
// grids list every (variant, case) a stage runs and none it refuses.
TEST(GridDeclarations, ModsForwardCasesAgreeWithRefusals) {
  std::vector<ModCase> cs = cases();
  for (const ModCase& m : decode_cases()) cs.push_back(m);
  cs.push_back(config_case(64));
  cs.push_back(config_case(128));
  for (const ModCase& m : cs) expect_declarations_agree(mods_problem(m), [](const Stage&) { return true; });
}

// Step 4's lesson variants before 4e refuse each modifier with the reason; 4e, 4f and the variants a user runs
// take them all.
TEST(Step4ScoreMods, LessonVariantsRefuseThemUserVariantsTakeThem) {
  const Stage& s = find_stage("step4_fused_pipelined");
  for (int64_t d : {64, 128})
    for (int mod = 0; mod < 4; ++mod) {
      Problem p = to_problem({1, 4, 2, 256, 256, d, true, kDefaultPos, DType::bf16, 0.0f}, false);
      const Problem plain = p;
      p.bias = mod == 0;
      p.alibi = mod == 1;
      p.softcap = mod == 2 ? 30.0f : 0.0f;
      p.window_left = mod == 3 ? 64 : -1;
      const std::string what = "d " + std::to_string(d) + ", modifier " + std::to_string(mod);
      for (const std::string v : {"4a-padded", "4b-swizzle", "4c-cp-async"}) {
        EXPECT_NE(s.unsupported(p, v).find("score modifiers run in 4e's and 4f's configurations"), std::string::npos)
            << v << ", " << what << ": " << s.unsupported(p, v);
        EXPECT_EQ(s.unsupported(plain, v), "") << v << " runs a plain problem";
      }
      for (const std::string v : {"auto", "sm90", "sm120", "4e-score-mods", "4f-split-kv"})
        EXPECT_EQ(s.unsupported(p, v), "") << v << ", " << what;
      EXPECT_NE(s.unsupported(p, "4d-tma").find("4d-tma is the sub-step before the score modifiers"), std::string::npos)
          << what << ": " << s.unsupported(p, "4d-tma");
      EXPECT_EQ(s.unsupported(plain, "4d-tma"), "") << "4d-tma runs a plain problem";
      p.splits = 3;  // the split-KV path takes them too
      EXPECT_EQ(s.unsupported(p, "auto"), "") << what;
      EXPECT_EQ(s.unsupported(p, "4f-split-kv"), "") << what;
    }
}

// On the command line: step 4's 4a-padded refuses --softcap (exit 2, one line, before any GPU is asked
// for); steps 1 to 6 declare the modifiers, so none of them refuses the flags as such (step 7, Hopper
// only, has none: it refuses them).
TEST(Step4ScoreMods, CommandLineRefusesThemOnLessonVariants) {
  const cli_test::CliResult r =
      cli_test::run_stage_main("step4_fused_pipelined", {"--seq", "64", "--variant", "4a-padded", "--softcap", "30"});
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("step4_fused_pipelined cannot run this problem: score modifiers run in 4e's and 4f's "
                       "configurations"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  for (const char* name : {"step1_cpu_reference", "step2_online_softmax", "step3_naive_kernel", "step4_fused_pipelined",
                           "step5_backward", "step6_autotune"})
    EXPECT_TRUE(find_stage(name).has_score_mods) << name;
  const cli_test::CliResult r3 = cli_test::run_stage_main("step3_naive_kernel", {"--seq", "8", "--window", "2,0"});
  EXPECT_EQ(r3.err.find("has no score modifiers"), std::string::npos) << r3.err;
  EXPECT_EQ(r3.err.find("cannot run this problem"), std::string::npos) << r3.err;
}

}  // namespace
}  // namespace fa::grid
