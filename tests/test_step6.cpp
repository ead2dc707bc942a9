// FlashAttention, step by step — tests of step 6, the autotuner: the device filter (with a fake sm_120
// description) for the forward and backward configs, the cache key, DISABLE_AUTOTUNE, and (on a GPU)
// the cache round trip of both passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/registry.h"
#include "step4_fused_pipelined/fused.h"
#include "step5_backward/backward.h"
#include "step6_autotune/autotune.h"

namespace fa {
namespace {

Problem problem(int64_t d, int64_t n, bool causal = false, int64_t hkv = 4) {
  Problem p;
  p.B = 1;
  p.Hq = 4;
  p.Hkv = hkv;
  p.Nq = p.Nk = n;
  p.d = d;
  p.causal = causal;
  p.input_pos = 0;
  p.scale = 1.0f / std::sqrt(float(d));
  p.dtype = DType::bf16;
  return p;
}

// An RTX 50-series card as its driver describes it: 99 KB of opt-in shared memory per block.
const step6::DeviceLimits kFakeSm120{"NVIDIA GeForce RTX 5090 (fake)", 12, 0, 99 * 1024, 1024};
const step6::DeviceLimits kFakeH100{"NVIDIA H100 80GB HBM3 (fake)", 9, 0, 227 * 1024, 1024};

TEST(Step6Filter, RejectsConfigsThatDoNotFitSm120) {
  const Stage s = step4::stage();
  for (int64_t d : {64, 128}) {
    const Problem p = problem(d, 1024);
    std::vector<std::string> rejected;
    const auto ok = step6::feasible_variants(s, p, kFakeSm120, &rejected);
    for (const auto& v : ok) EXPECT_LE(s.launch_shape(p, v).smem_bytes, kFakeSm120.smem_optin) << v;
    EXPECT_NE(std::find(ok.begin(), ok.end(), "Br64-Bc64-W4-S2"), ok.end()) << "the sm_120 default must survive";
    EXPECT_EQ(ok.size() + rejected.size(), s.tuning_variants.size());
    if (d == 128) {  // Bc = 128 at d = 128 needs 161 KB: an H100 runs it, an RTX 50-series cannot
      EXPECT_EQ(std::find(ok.begin(), ok.end(), "Br128-Bc128-W8-S2"), ok.end());
      EXPECT_NE(std::find_if(rejected.begin(), rejected.end(),
                             [](const std::string& r) { return r.rfind("Br128-Bc128-W8-S2:", 0) == 0 &&
                                                               r.find("shared memory") != std::string::npos; }),
                rejected.end());
    }
    // On an H100 everything fits: only the chapter's lessons (sub-steps 4a-4c, the block-order ablation) are
    // left out, by step 4's tuning_exclusion.
    const size_t lessons = std::count_if(s.tuning_variants.begin(), s.tuning_variants.end(),
                                         [&](const std::string& v) { return !s.tuning_exclusion(v).empty(); });
    EXPECT_EQ(lessons, 7u) << "4a, 4b, 4c at two tile shapes, and the ablation";
    EXPECT_EQ(step6::feasible_variants(s, p, kFakeH100).size(), s.tuning_variants.size() - lessons) << "d = " << d;
  }
}

// Step 5's list holds configs of both head dims (the deterministic ones' Bq differs): the other head dim's
// are rejected with that reason. The atomic configs are never candidates (the default is deterministic,
// and tuning must not trade that away), whatever the device: on an RTX 50-series card the big one would
// not fit anyway.
TEST(Step6Filter, RejectsBackwardConfigsThatDoNotFitSm120OrAreNotDeterministic) {
  const Stage s = step5::stage();
  for (int64_t d : {64, 128}) {
    Problem p = problem(d, 1024);
    p.backward = true;
    std::vector<std::string> rejected;
    const auto ok = step6::feasible_variants(s, p, kFakeSm120, &rejected);
    EXPECT_EQ(ok.size() + rejected.size(), s.tuning_variants.size());
    for (const auto& v : ok) EXPECT_LE(s.launch_shape(p, v).smem_bytes, kFakeSm120.smem_optin) << v;
    EXPECT_NE(std::find(ok.begin(), ok.end(), step6::default_config(s, p, kFakeSm120)), ok.end())
        << "the default must fit sm_120";
    for (const auto* dev : {&kFakeSm120, &kFakeH100}) {
      std::vector<std::string> why;
      const auto fit = step6::feasible_variants(s, p, *dev, &why);
      for (const auto& v : fit) EXPECT_EQ(v.find("atomic"), std::string::npos) << v;
      const auto it = std::find_if(why.begin(), why.end(), [](const std::string& w) {
        return w.rfind("kv128x64-w2x4-S2-atomic:", 0) == 0;
      });
      ASSERT_NE(it, why.end());
      EXPECT_NE(it->find("deterministic"), std::string::npos) << *it;
    }
  }
}

TEST(Step6Cache, KeyBucketsSequenceLengthsAndSeparatesFeatures) {
  const Stage s = step4::stage();
  const auto key = [&](const Problem& p) { return step6::cache_key(s, p, kFakeH100); };
  EXPECT_EQ(key(problem(128, 3000)), key(problem(128, 4096)));
  EXPECT_NE(key(problem(128, 4096)), key(problem(128, 4097)));
  EXPECT_NE(key(problem(128, 4096)), key(problem(128, 4096, true)));
  EXPECT_NE(key(problem(128, 4096)), key(problem(64, 4096)));
  EXPECT_NE(key(problem(128, 4096)), key(problem(128, 4096, false, 1)));  // GQA group 4 vs 1
  EXPECT_NE(key(problem(128, 4096)), step6::cache_key(s, problem(128, 4096), kFakeSm120));
  Problem dropout = problem(128, 4096);
  dropout.dropout = 0.1f;  // another kernel (kDropout): tuned apart
  EXPECT_NE(key(problem(128, 4096)), key(dropout));
}

TEST(Step6Pick, KeepsTheDefaultUnlessACandidateWinsByMoreThanTheNoise) {
  const std::vector<std::pair<std::string, double>> table = {{"A", 300.0}, {"B", 306.0}, {"C", 250.0}};
  EXPECT_EQ(step6::pick(table, "A", 0.03), "A");  // B is 2% faster: within the run-to-run spread
  EXPECT_EQ(step6::pick(table, "A", 0.01), "B");  // with a tighter margin B wins
  EXPECT_EQ(step6::pick(table, "C", 0.03), "B");  // B is 22% faster than the default C
  EXPECT_EQ(step6::pick(table, "", 0.03), "B");   // no default in the table: the fastest
  EXPECT_EQ(step6::pick(table, "B", 0.03), "B");  // the default is the fastest
}

TEST(Step6, DisableAutotuneUsesTheDefaultWithoutTiming) {
  for (const char* var : {"DISABLE_AUTOTUNE", "FMHA_DISABLE_AUTOTUNE"}) {
    setenv(var, "1", 1);
    const step6::Choice c = step6::Autotuner("/nonexistent/cache.json").choose(step4::stage(), problem(128, 4096));
    EXPECT_EQ(c.variant, "auto");
    EXPECT_NE(c.source.find("DISABLE_AUTOTUNE"), std::string::npos);
    EXPECT_TRUE(c.table.empty());
    unsetenv(var);
  }
}

TEST(Step6, CacheRoundTripsAndTimesNothingTheSecondTime) {
  if (const std::string why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  unsetenv("DISABLE_AUTOTUNE");
  unsetenv("FMHA_DISABLE_AUTOTUNE");
  const std::string file = (std::filesystem::temp_directory_path() / "fa_step6_cache_test.json").string();
  std::remove(file.c_str());
  Problem bwd = problem(64, 512);
  bwd.backward = true;
  // The forward on step 4, the backward on step 5: two entries of one cache file.
  for (const auto& [s, p] : {std::make_pair(step4::stage(), problem(64, 512)), std::make_pair(step5::stage(), bwd)}) {
    SCOPED_TRACE(s.name);
    step6::Autotuner tuner(file);
    const step6::Choice first = tuner.choose(s, p);
    EXPECT_EQ(first.source, "tuned now");
    EXPECT_EQ(first.table.size(), step6::feasible_variants(s, p, step6::current_device()).size());
    EXPECT_EQ(first.variant, step6::pick(first.table, step6::default_config(s, p, step6::current_device())));
    const step6::Choice second = step6::Autotuner(file).choose(s, p);
    EXPECT_EQ(second.source, "cache");
    EXPECT_EQ(second.variant, first.variant);
    EXPECT_TRUE(second.table.empty());
    EXPECT_EQ(tuner.cached(s, p), first.variant);
  }
  step6::Autotuner(file).clear();
  EXPECT_FALSE(std::filesystem::exists(file));
}

}  // namespace
}  // namespace fa
