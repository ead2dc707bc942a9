// FlashAttention, step by step — tests of step 6, the autotuner: the device filter (with a fake sm_120
// description) for the forward and backward configs, the cache key, DISABLE_AUTOTUNE, and (on a GPU)
// the cache round trip of both passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/random.h"
#include "harness/registry.h"
#include "step4_fused_pipelined/configs.h"
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

// Existing cache files stay valid: the key of a problem without score modifiers is exactly what it was
// before the modifiers existed.
TEST(Step6Cache, KeyOfAPlainProblemIsUnchanged) {
  const Stage s = step4::stage();
  EXPECT_EQ(step6::cache_key(s, problem(128, 3000), kFakeH100),
            "NVIDIA H100 80GB HBM3 (fake)|sm90|step4_fused_pipelined|fwd|bf16|d128|full|g1|N<=4096");
  Problem p = problem(64, 1000, true, 1);
  p.dropout = 0.1f;
  EXPECT_EQ(step6::cache_key(s, p, kFakeSm120),
            "NVIDIA GeForce RTX 5090 (fake)|sm120|step4_fused_pipelined|fwd|bf16|d64|causal|g4|dropout|N<=1024");
  // A bias shape given for a problem without a bias changes nothing.
  EXPECT_EQ(step6::cache_key(s, problem(128, 3000), kFakeH100, {1, 4, 3000, 3000}),
            step6::cache_key(s, problem(128, 3000), kFakeH100));
}

// The score modifiers run other kernels (and a bias is traffic of its own): a configuration tuned for a
// plain problem is never reused for a modified one, nor one modifier's for another's.
TEST(Step6Cache, KeySeparatesScoreModifiers) {
  const Stage s = step4::stage();
  const auto key = [&](const Problem& p, std::vector<int64_t> bias_shape = {}) {
    return step6::cache_key(s, p, kFakeH100, bias_shape);
  };
  Problem plain = problem(128, 4096, true);
  plain.B = 2;
  Problem bias = plain, alibi = plain, softcap = plain, window = plain, all = plain;
  bias.bias = true;
  alibi.alibi = true;
  softcap.softcap = 30.0f;
  window.window_left = 256;
  all.bias = all.alibi = true;
  all.softcap = 30.0f;
  all.window_left = 256;
  std::vector<std::string> keys;
  for (const Problem* p : {&plain, &bias, &alibi, &softcap, &window, &all}) keys.push_back(key(*p));
  std::vector<std::string> unique = keys;
  std::sort(unique.begin(), unique.end());
  EXPECT_EQ(std::unique(unique.begin(), unique.end()), unique.end()) << "each modifier tunes apart";
  EXPECT_NE(key(bias).find("|biasBH|"), std::string::npos) << key(bias);  // no shape given: a full bias
  EXPECT_NE(key(all).find("|biasBH|alibi|softcap|win<=256,0|N<=4096"), std::string::npos) << key(all);
  // The bias's broadcast shape: [B|1, Hq|1, Nq, Nk]; the full one is the one assumed without a shape.
  EXPECT_EQ(key(bias, {2, 4, 4096, 4096}), key(bias));
  EXPECT_NE(key(bias, {1, 4, 4096, 4096}), key(bias));
  EXPECT_NE(key(bias, {2, 1, 4096, 4096}), key(bias));
  EXPECT_NE(key(bias, {1, 1, 4096, 4096}), key(bias, {1, 4, 4096, 4096}));
  EXPECT_NE(key(bias, {1, 1, 4096, 4096}).find("|bias11|"), std::string::npos);
  // The softcap's value and ALiBi's slopes change no work: one key. The window is bucketed like N.
  Problem softcap5 = softcap;
  softcap5.softcap = 5.0f;
  EXPECT_EQ(key(softcap5), key(softcap));
  Problem window200 = window, window300 = window, window_r = window;
  window200.window_left = 200;
  window300.window_left = 300;
  EXPECT_EQ(key(window200), key(window));
  EXPECT_NE(key(window300), key(window));
  window_r.causal = false;  // without causal, the right side counts: unbounded here
  EXPECT_NE(key(window_r).find("|win<=256,-1|"), std::string::npos) << key(window_r);
  window_r.window_right = 0;
  EXPECT_NE(key(window_r).find("|win<=256,0|"), std::string::npos) << key(window_r);
}

// Step 4 compiles the score modifiers into its TMA kernels with swizzled tiles in the default block order
// (kernel_traits.h: kHasMods), not into its chapter's lessons and ablations. With a modifier on, its
// unsupported refuses those, and the tuner skips them with that reason (it never makes one): the unswizzled
// ablation, a candidate for a plain problem, is no candidate here; the others stay candidates.
// A decode's split count depends on how many blocks it has without splits (B * Hkv, and the rows of a KV
// head's queries): those tune apart; a prefill's key does not change.
TEST(Step6Cache, KeyOfADecodeNamesItsBlocks) {
  const Stage s = step4::stage();
  Problem decode = problem(128, 8192, true, 8);
  decode.Hq = 32;
  decode.Nq = 1;
  decode.input_pos = decode.Nk - 1;
  const auto key = [&](const Problem& p) { return step6::cache_key(s, p, kFakeH100); };
  EXPECT_NE(key(decode).find("|causal|g4|decode:BHkv<=8,rows<=4|N<=8192"), std::string::npos) << key(decode);
  Problem batch = decode, rows = decode, near = decode;
  batch.B = 8;
  rows.Nq = 16;
  rows.input_pos = rows.Nk - 16;
  near.Hkv = 7;  // B * Hkv = 7: the same bucket
  near.Hq = 28;
  EXPECT_NE(key(batch), key(decode));
  EXPECT_NE(key(rows), key(decode));
  EXPECT_EQ(key(near), key(decode));
  EXPECT_EQ(key(problem(128, 8192, true, 8)).find("decode"), std::string::npos) << "a prefill keeps its key";
  Problem forced = decode;
  forced.splits = 4;  // --splits given: nothing to tune
  EXPECT_EQ(key(forced).find("decode"), std::string::npos);
}

// Step 6 times each 4f configuration of a decode with the split counts that change a split's share of
// the K/V tiles; nothing else gets split counts.
TEST(Step6Splits, OffersSplitCountsToSplitKvConfigsAtDecodeOnly) {
  const Stage s = step4::stage();
  ASSERT_TRUE(s.tuning_splits);
  Problem p = problem(64, 1000, true, 1);
  p.Nq = 1;
  p.input_pos = p.Nk - 1;
  const std::string split_kv = s.config_of(p, "auto", 9);
  ASSERT_TRUE(step4::is_split_kv(split_kv)) << split_kv;
  const int64_t bc = step4::tiles_named(split_kv)->Bc;
  const int64_t tiles = (p.Nk + bc - 1) / bc;
  const std::vector<int64_t> counts = s.tuning_splits(p, split_kv);
  ASSERT_FALSE(counts.empty());
  EXPECT_EQ(counts.front(), 1);
  int64_t last = 0;
  for (int64_t n : counts) {
    EXPECT_LE(n, tiles) << "more splits than K/V tiles add blocks with nothing to do";
    EXPECT_NE((tiles + n - 1) / n, last) << n << " splits walk as many tiles each as the count before";
    last = (tiles + n - 1) / n;
  }
  EXPECT_TRUE(s.tuning_splits(p, s.config_of(p, "sm90", 9)).empty()) << "4d has no split-KV path";
  Problem prefill = problem(64, 1000, true, 1);
  EXPECT_TRUE(s.tuning_splits(prefill, split_kv).empty()) << "a prefill is not split";
  Problem forced = p;
  forced.splits = 3;
  EXPECT_TRUE(s.tuning_splits(forced, split_kv).empty()) << "--splits given: nothing to tune";
}

TEST(Step6Filter, SkipsConfigsThatCannotRunScoreModifiers) {
  const Stage s = step4::stage();
  for (int64_t d : {64, 128}) {
    Problem p = problem(d, 1024);
    p.softcap = 30.0f;
    std::vector<std::string> rejected;
    const auto ok = step6::feasible_variants(s, p, kFakeH100, &rejected);
    EXPECT_EQ(ok.size() + rejected.size(), s.tuning_variants.size());
    std::vector<std::string> plain_ok_with_mods;
    for (const std::string& v : step6::feasible_variants(s, problem(d, 1024), kFakeH100))
      if (s.unsupported(p, v).empty()) plain_ok_with_mods.push_back(v);
    EXPECT_EQ(ok, plain_ok_with_mods) << "the plain problem's candidates that take the modifiers";
    EXPECT_EQ(ok.size() + 1, step6::feasible_variants(s, problem(d, 1024), kFakeH100).size());
    EXPECT_EQ(std::find(ok.begin(), ok.end(), "Br64-Bc64-W4-S2-noswizzle"), ok.end());
    EXPECT_NE(std::find(ok.begin(), ok.end(), step6::default_config(s, p, kFakeH100)), ok.end());
    EXPECT_NE(std::find(ok.begin(), ok.end(), "4f-Br64-Bc64-W4-S2"), ok.end());
    size_t refused = 0;
    for (const std::string& r : rejected)
      if (r.find("score modifiers run in 4e's and 4f's configurations") != std::string::npos) ++refused;
    EXPECT_EQ(refused, 8u) << "4a, 4b, 4c at two tile shapes, the block-order and the unswizzled ablations";
  }
  // Step 6's own stage takes the modifiers, and refuses what step 4's default cannot run.
  const Stage s6 = step6::stage("/nonexistent/cache.json");
  EXPECT_TRUE(s6.has_score_mods);
  Problem p = problem(64, 1024);
  p.alibi = true;
  EXPECT_EQ(s6.unsupported(p, "tuned"), "");
  p.dtype = DType::fp32;
  EXPECT_NE(s6.unsupported(p, "tuned"), "");
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

// Tuning switched on (whatever the suite's environment says) and an empty cache file of this name in the
// temporary folder: its path.
std::string fresh_tuning_cache(const char* name) {
  unsetenv("DISABLE_AUTOTUNE");
  unsetenv("FMHA_DISABLE_AUTOTUNE");
  const std::string file = (std::filesystem::temp_directory_path() / name).string();
  std::remove(file.c_str());
  return file;
}

TEST(Step6, CacheRoundTripsAndTimesNothingTheSecondTime) {
  if (const std::string why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string file = fresh_tuning_cache("fa_step6_cache_test.json");
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

// Step 4's own choice of splits (configs.h): one of the counts step 6 tries; none once the blocks fill two
// per SM; otherwise every split keeps at least kMinSplitKeys keys.
TEST(Step4Splits, ChoiceFillsTwoBlocksPerSmAndLeavesEachSplitItsKeys) {
  for (int sms : {48, 132})
    for (int64_t blocks : {1, 8, 32, 64, 200, 256, 1000})
      for (int64_t kv_tiles : {1, 2, 3, 16, 64, 512})
        for (int64_t tile_keys : {64, 128}) {
          SCOPED_TRACE("SMs " + std::to_string(sms) + " blocks " + std::to_string(blocks) + " tiles " +
                       std::to_string(kv_tiles) + " of " + std::to_string(tile_keys) + " keys");
          const int s = step4::choose_splits(blocks, kv_tiles, tile_keys, sms);
          const std::vector<int> counts = step4::split_counts(kv_tiles);
          EXPECT_NE(std::find(counts.begin(), counts.end(), s), counts.end());
          if (blocks >= 0.8 * 2 * sms) {
            EXPECT_EQ(s, 1);
          }
          if (s > 1) {
            EXPECT_LE(s * step4::kMinSplitKeys, kv_tiles * tile_keys);
          }
        }
  EXPECT_EQ(step4::choose_splits(8, 64, 64, 132), 32);   // 8 x 32 = 256 blocks: 97 % of 2 x 132, 128 keys each
  EXPECT_EQ(step4::choose_splits(8, 16, 128, 132), 16);  // 128 blocks of one 128-key tile: no count fills more
  EXPECT_EQ(step4::choose_splits(8, 32, 64, 132), 16);   // not 32: a split of one 64-key tile is too short
  EXPECT_EQ(step4::choose_splits(32, 256, 64, 132), 8);
  EXPECT_EQ(step4::choose_splits(264, 256, 64, 132), 1);
}

// A decode: every 4f configuration is timed with each split count too; the choice (configuration and split
// count) is cached, read back, and computes what step 1 computes.
TEST(Step6, TunesTheSplitsOfADecodeAndCachesThem) {
  if (const std::string why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string file = fresh_tuning_cache("fa_step6_splits_test.json");
  const Stage s = step4::stage();
  Problem p = problem(128, 3000, true, 1);
  p.Nq = 1;
  p.input_pos = p.Nk - 1;
  const step6::DeviceLimits dev = step6::current_device();
  size_t runs = 0;
  for (const std::string& v : step6::feasible_variants(s, p, dev)) runs += 1 + s.tuning_splits(p, v).size();
  const step6::Choice first = step6::Autotuner(file).choose(s, p);
  EXPECT_EQ(first.source, "tuned now");
  EXPECT_EQ(first.table.size(), runs) << "every configuration once, and each 4f one with every split count";
  EXPECT_GT(runs, step6::feasible_variants(s, p, dev).size());
  const std::string label = first.splits ? first.variant + " splits=" + std::to_string(first.splits) : first.variant;
  EXPECT_EQ(label, step6::pick(first.table, step6::default_config(s, p, dev)));
  const step6::Choice second = step6::Autotuner(file).choose(s, p);
  EXPECT_EQ(second.source, "cache");
  EXPECT_EQ(second.variant, first.variant);
  EXPECT_EQ(second.splits, first.splits);
  // What the choice runs is checked like any run.
  const Problem tuned = step6::with_splits(p, second);
  const Inputs in = random_inputs(tuned);
  auto runner = s.make(tuned, in, second.variant);
  runner->run();
  EXPECT_TRUE(check_against_reference(tuned, in, runner->outputs()).pass);
  step6::Autotuner(file).clear();
}

}  // namespace
}  // namespace fa
