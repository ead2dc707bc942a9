// FlashAttention, step by step — the kernels' host-side arithmetic, without a GPU (tests/test_host_kernels.cpp).
//
// What decides which work a GPU block does is plain integer and float arithmetic the kernels share with the
// host (FA_HD, or CUDA-free headers), so CI checks it where no GPU runs:
//  - the tile ranges (core/tile_range.h): the K/V tiles a query tile visits (step 4's scheduler, 4f, step 7)
//    and the query tiles a key block visits (step 5), against brute force over every (row, key) pair of
//    many random small problems: a tile is in the range iff some pair of it is visible (core/score_mod.h);
//  - split-KV's shares (4f): the splits of a query tile cover its tiles once each, with the tile count the
//    host divides (step4_fused_pipelined/splits.h, split_kv_tiles) never short of what a tile walks;
//  - the plain kernels' mask type (step4_fused_pipelined/mask.h, CausalMask): its tile test says "needs the
//    element test" exactly when some element of the tile is hidden, and its element test and apply_mask agree
//    with the causal rule, element by element;
//  - the split counts step 6 tries and the one step 4 picks (splits.h: split_counts, choose_splits);
//  - the merge of split-KV's partial results (core/online_softmax.h: merge_states, merge_acc, partial_state,
//    the functions combine.cuh runs), against the unsplit result in fp64, empty splits included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/online_softmax.h"
#include "core/score_mod.h"
#include "core/tile_range.h"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/splits.h"

namespace fa {
namespace {

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // in [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A random small mask: causal or not, input_pos anywhere from "every row sees nothing" to "every row past
// K", and (with_window) a sliding window with sides of 0 .. 12 keys or unbounded (-1).
ScoreMod random_mask(std::mt19937_64& rng, int64_t Nq, int64_t Nk, bool with_window) {
  ScoreMod m;
  m.causal = uniform(rng, 0, 1) == 1;
  m.input_pos = uniform(rng, -Nq - 3, Nk + 3);
  if (with_window) {
    m.window_left = uniform(rng, -1, 12);
    m.window_right = uniform(rng, -1, 12);
  }
  return m;
}

std::string describe(const ScoreMod& m, int64_t Nq, int64_t Nk) {
  return "Nq " + std::to_string(Nq) + " Nk " + std::to_string(Nk) + (m.causal ? " causal" : "") + " input_pos " +
         std::to_string(m.input_pos) + " window " + std::to_string(m.window_left) + "," + std::to_string(m.window_right);
}

// Does some row of [i0, i1] see some key of [j0, j1]?
bool any_visible(const ScoreMod& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  for (int64_t i = i0; i <= i1; ++i)
    for (int64_t j = j0; j <= j1; ++j)
      if (visible(m, i, j)) return true;
  return false;
}

// The K/V tiles of a query tile, as step 4's scheduler and 4f ask for them: rows first .. last, with the
// window's mask (the kernels compiled with score modifiers) or with the causal mask alone (the plain ones,
// which never see a window). The range is exactly the tiles holding a visible (row, key) pair.
TEST(TileRanges, KeyTilesOfRowsAreExactlyTheTilesTheySee) {
  std::mt19937_64 rng(1);
  int nonempty = 0, cut_left = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int64_t Nq = uniform(rng, 1, 40), Nk = uniform(rng, 1, 40);
    const int Bc = int(uniform(rng, 1, 9));
    const bool with_window = trial % 2 == 1;
    const ScoreMod m = random_mask(rng, Nq, Nk, with_window);
    const int64_t first = uniform(rng, 0, Nq - 1), last = uniform(rng, first, Nq - 1);
    const TileRange r = key_tiles(m.causal, m.input_pos, Nk, first, last, Bc, with_window ? &m : nullptr);
    SCOPED_TRACE(describe(m, Nq, Nk) + " rows " + std::to_string(first) + ".." + std::to_string(last) + " Bc " +
                 std::to_string(Bc));
    ASSERT_GE(r.count(), 0);
    const int tiles = int((Nk + Bc - 1) / Bc);
    for (int t = 0; t < tiles; ++t) {
      const bool seen = any_visible(m, first, last, int64_t(t) * Bc, std::min<int64_t>(int64_t(t + 1) * Bc, Nk) - 1);
      const bool in_range = t >= r.begin && t < r.end;
      ASSERT_EQ(in_range, seen) << "K/V tile " << t << " of range [" << r.begin << ", " << r.end << ")";
    }
    if (r.count() > 0) {  // an empty range may keep a begin past K (rows past its end): nothing is loaded
      ASSERT_LE(r.end, tiles);
    }
    nonempty += r.count() > 0;
    cut_left += r.count() > 0 && r.begin > 0;
  }
  EXPECT_GT(nonempty, 10000) << "the random problems must reach the tiles, not only the empty ranges";
  EXPECT_GT(cut_left, 1000) << "and windows that cut the left end";
}

// The kernels with score modifiers take the window's path even without a window: it gives the plain path's
// range whenever the range is not empty.
TEST(TileRanges, KeyTilesOfAMaskWithoutWindowAreThePlainOnes) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 5000; ++trial) {
    const int64_t Nq = uniform(rng, 1, 60), Nk = uniform(rng, 1, 60);
    const int Bc = int(uniform(rng, 1, 16));
    const ScoreMod m = random_mask(rng, Nq, Nk, /*with_window=*/false);
    const int64_t first = uniform(rng, 0, Nq - 1), last = uniform(rng, first, Nq - 1);
    const TileRange plain = key_tiles(m.causal, m.input_pos, Nk, first, last, Bc);
    const TileRange masked = key_tiles(m.causal, m.input_pos, Nk, first, last, Bc, &m);
    ASSERT_EQ(plain.count(), masked.count()) << describe(m, Nq, Nk);
    if (plain.count() > 0) {
      ASSERT_EQ(plain.begin, masked.begin) << describe(m, Nq, Nk);
    }
  }
}

// Step 5's key blocks: the query tiles of Bq rows whose rows see a key of [k0, k0 + Bc), with the window's
// mask or the causal mask alone; exactly those holding a visible pair.
TEST(TileRanges, QueryTilesOfAKeyBlockAreExactlyTheTilesThatSeeIt) {
  std::mt19937_64 rng(3);
  int nonempty = 0, cut_top = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int Nq = int(uniform(rng, 1, 40)), Nk = int(uniform(rng, 1, 40));
    const int Bc = int(uniform(rng, 1, 9)), Bq = int(uniform(rng, 1, 9));
    const bool with_window = trial % 2 == 1;
    const ScoreMod m = random_mask(rng, Nq, Nk, with_window);
    const int k0 = int(uniform(rng, 0, (Nk - 1) / Bc)) * Bc;
    const TileRange r = query_tiles(m.causal, m.input_pos, Nq, Nk, k0, Bc, Bq, with_window ? &m : nullptr);
    SCOPED_TRACE(describe(m, Nq, Nk) + " keys " + std::to_string(k0) + " +" + std::to_string(Bc) + " Bq " +
                 std::to_string(Bq));
    ASSERT_GE(r.count(), 0);
    const int k_last = std::min(k0 + Bc, Nk) - 1;
    const int tiles = (Nq + Bq - 1) / Bq;
    for (int t = 0; t < tiles; ++t) {
      const bool seen = any_visible(m, int64_t(t) * Bq, std::min<int64_t>(int64_t(t + 1) * Bq, Nq) - 1, k0, k_last);
      const bool in_range = t >= r.begin && t < r.end;
      ASSERT_EQ(in_range, seen) << "query tile " << t << " of range [" << r.begin << ", " << r.end << ")";
    }
    ASSERT_LE(r.end, tiles);
    nonempty += r.count() > 0;
    cut_top += r.count() > 0 && r.begin > 0;
  }
  EXPECT_GT(nonempty, 10000);
  EXPECT_GT(cut_top, 1000);
}

// ---- the mask type (step 4's mask.h) ---------------------------------------------------------------------

// Random tiles of random causal and non-causal problems (bottom-right alignment and around it, rows that see
// no key included): CausalMask's tile test on the first row's diagonal is true iff some (row, key) of the
// tile is hidden (a key past Nk, or above a row's diagonal), and its element tests are the causal rule's (for rows of Q).
TEST(CausalMaskType, TileTestIsTrueExactlyWhenAnElementIsHidden) {
  std::mt19937 rng(11);
  int needed = 0, untouched = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    AttnParams p{};
    p.Nq = 1 + int(rng() % 200);
    p.Nk = 1 + int(rng() % 200);
    p.causal = rng() % 4 != 0;
    p.input_pos = int64_t(p.Nk) - p.Nq + int64_t(rng() % 41) - 20;
    const step4::CausalMask mask(p);
    const int rows = 16 << (rng() % 3), cols = 16 << (rng() % 4);
    const int first = int(rng() % unsigned(p.Nq)), last = std::min(first + rows - 1, p.Nq - 1);
    const int k0 = int(rng() % unsigned((p.Nk + cols - 1) / cols)) * cols;
    bool hidden = false;
    for (int i = first; i <= last; ++i)
      for (int j = k0; j < k0 + cols; ++j) {
        const bool vis = j < p.Nk && sees(p.causal, p.input_pos, i, j);
        ASSERT_EQ(mask.visible(mask.row(0, 0, i), j), vis) << "row " << i << " key " << j;
        ASSERT_EQ(mask(1.5f, mask.row(0, 0, i), j), vis ? 1.5f : -INFINITY);
        hidden = hidden || !vis;
      }
    ASSERT_FALSE(mask.visible(mask.row(0, 0, p.Nq), 0));  // the element test: a row of Q (the backward's rows past it)
    EXPECT_EQ(mask.needs(mask.span(first, last), k0, cols), hidden)
        << "Nq " << p.Nq << " Nk " << p.Nk << " causal " << p.causal << " input_pos " << p.input_pos << " rows "
        << first << ".." << last << " keys " << k0 << "+" << cols;
    (hidden ? needed : untouched) += 1;
  }
  EXPECT_GT(needed, 300);  // both answers were asked for often
  EXPECT_GT(untouched, 300);
}

// apply_mask over a thread's S accumulators (mask.h's layout: s[nt][0..1] row r0, s[nt][2..3] row r8, keys
// key_2t + 8nt, +1) hides exactly the scores the element test hides and leaves the others as they were.
TEST(CausalMaskType, ApplyMaskFollowsTheFragmentLayout) {
  AttnParams p{};
  p.Nq = 40;
  p.Nk = 70;
  p.causal = true;
  p.input_pos = 30;
  const step4::CausalMask mask(p);
  for (int r0 : {0, 8, 24, 31})
    for (int key_2t : {0, 6, 34, 62}) {
      float s[8][4];
      for (int nt = 0; nt < 8; ++nt)
        for (int e = 0; e < 4; ++e) s[nt][e] = float(nt * 4 + e);
      step4::apply_mask(mask, s, r0, r0 + 8, key_2t);
      for (int nt = 0; nt < 8; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int i = e < 2 ? r0 : r0 + 8, j = key_2t + 8 * nt + (e & 1);
          const bool vis = j < p.Nk && sees(p.causal, p.input_pos, i, j);
          EXPECT_EQ(s[nt][e], vis ? float(nt * 4 + e) : -INFINITY) << "row " << i << " key " << j;
        }
    }
}

// ---- split-KV (4f) --------------------------------------------------------------------------------------

// The K/V tiles 4f's query tile walks (kernel_4f_split_kv.cuh): view row r is query row r % Nq of head r / Nq
// of its group when packed; a tile whose rows wrap around to the next head walks the rows 0 .. Nq - 1.
TileRange tile_of_4f(const ScoreMod& m, int64_t Nq, int64_t Nk, int64_t view_Nq, int64_t m0, int Br, int Bc,
                     bool packed, bool mods) {
  const int64_t last_row = std::min(m0 + Br, view_Nq) - 1;
  const bool spans_heads = packed && last_row / Nq != m0 / Nq;
  auto pos = [&](int64_t r) { return packed ? r % Nq : r; };
  const int64_t last_i = spans_heads ? Nq - 1 : pos(last_row);
  return key_tiles(m.causal, m.input_pos, Nk, spans_heads ? 0 : pos(m0), last_i, Bc, mods ? &m : nullptr);
}

// The host divides split_kv_tiles' count among the splits (prepare.cuh: tiles_per_split = ceil(count /
// splits)); every query tile's own range must fit in it, so that the splits' shares (split_share) cover the
// range: each of its tiles in exactly one split, none outside it, in order.
TEST(SplitKv, SharesCoverEveryTileOfEveryQueryTileOnce) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t Nq = uniform(rng, 1, 24), Nk = uniform(rng, 1, 300), group = uniform(rng, 1, 4);
    const int Br = int(uniform(rng, 1, 16)), Bc = int(uniform(rng, 1, 32));
    const bool mods = trial % 2 == 1, packed = trial % 3 != 0;
    const ScoreMod m = random_mask(rng, Nq, Nk, mods);
    const int64_t view_Nq = packed ? group * Nq : Nq;
    const int kv_tiles = step4::split_kv_tiles(Nq, Nk, m.causal, m.window_left, m.window_right, Br, Bc);
    const int splits = int(uniform(rng, 1, 40));
    const int per_split = (kv_tiles + splits - 1) / splits;
    SCOPED_TRACE(describe(m, Nq, Nk) + " group " + std::to_string(group) + (packed ? " packed" : "") + " Br " +
                 std::to_string(Br) + " Bc " + std::to_string(Bc) + " splits " + std::to_string(splits));
    for (int64_t m0 = 0; m0 < view_Nq; m0 += Br) {
      const TileRange all = tile_of_4f(m, Nq, Nk, view_Nq, m0, Br, Bc, packed, mods);
      ASSERT_LE(all.count(), kv_tiles) << "query tile at row " << m0 << " walks more tiles than the splits divide";
      int next = all.begin;  // the shares follow one another
      for (int s = 0; s < splits; ++s) {
        const TileRange share = split_share(all, s, per_split);
        ASSERT_GE(share.count(), 0);
        if (share.count() == 0) continue;
        ASSERT_EQ(share.begin, next) << "split " << s;
        ASSERT_LE(share.end, all.end) << "split " << s;
        ASSERT_LE(share.count(), per_split);
        next = share.end;
      }
      ASSERT_EQ(next, std::max(all.begin, all.end)) << "the splits leave tiles " << next << ".." << all.end << " out";
    }
  }
}

// The counts step 6 times: 1 first, increasing, at most max(kv_tiles, 1) and 128, each giving its splits fewer
// tiles than the count before; a round count left out gives as many tiles per split as the last one taken.
TEST(Step4Splits, CountsGiveEachSplitFewerTilesThanTheCountBefore) {
  const std::vector<int> round = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
  for (int64_t kv_tiles = 1; kv_tiles <= 1000; ++kv_tiles) {  // Nk >= 1: at least one tile
    SCOPED_TRACE("kv_tiles " + std::to_string(kv_tiles));
    const std::vector<int> counts = step4::split_counts(kv_tiles);
    ASSERT_FALSE(counts.empty());
    EXPECT_EQ(counts.front(), 1);
    for (size_t k = 0; k < counts.size(); ++k) {
      EXPECT_NE(std::find(round.begin(), round.end(), counts[k]), round.end()) << counts[k];
      EXPECT_LE(counts[k], std::max<int64_t>(kv_tiles, 1));
      if (k > 0) {
        EXPECT_GT(counts[k], counts[k - 1]);
        EXPECT_LT((kv_tiles + counts[k] - 1) / counts[k], (kv_tiles + counts[k - 1] - 1) / counts[k - 1]);
      }
    }
    for (int n : round) {
      if (n > std::max<int64_t>(kv_tiles, 1) || std::find(counts.begin(), counts.end(), n) != counts.end()) continue;
      int taken = 1;  // the largest count taken below n
      for (int c : counts)
        if (c < n) taken = c;
      EXPECT_EQ((kv_tiles + n - 1) / n, (kv_tiles + taken - 1) / taken) << n << " is left out, yet gives fewer tiles";
    }
  }
}

// choose_splits (configs.h's rule, splits.h): a count of split_counts; 1 once the blocks fill 80 % of two
// per SM; otherwise the fewest counts whose waves fill the slots within 85 % of the best among those that
// leave each split kMinSplitKeys keys (1 always qualifies).
TEST(Step4Splits, ChoiceIsTheFewestThatFillsTheSlotsAndKeepsEachSplitItsKeys) {
  for (int sms : {1, 20, 48, 132, 170})
    for (int64_t blocks = 1; blocks <= 600; blocks += blocks < 40 ? 1 : 37)
      for (int64_t kv_tiles : {1, 2, 3, 5, 16, 31, 64, 200, 512, 4096})
        for (int64_t tile_keys : {64, 128, 176}) {
          SCOPED_TRACE("SMs " + std::to_string(sms) + " blocks " + std::to_string(blocks) + " tiles " +
                       std::to_string(kv_tiles) + " of " + std::to_string(tile_keys) + " keys");
          const int s = step4::choose_splits(blocks, kv_tiles, tile_keys, sms);
          const std::vector<int> counts = step4::split_counts(kv_tiles);
          ASSERT_NE(std::find(counts.begin(), counts.end(), s), counts.end());
          const int64_t slots = 2 * int64_t(sms);
          if (double(blocks) >= 0.8 * double(slots)) {
            EXPECT_EQ(s, 1);
            continue;
          }
          auto eligible = [&](int n) { return n == 1 || n * step4::kMinSplitKeys <= kv_tiles * tile_keys; };
          auto efficiency = [&](int n) {
            const int64_t waves = (blocks * n + slots - 1) / slots;
            return double(blocks * n) / double(waves * slots);
          };
          EXPECT_TRUE(eligible(s)) << s << " splits of " << kv_tiles * tile_keys << " keys";
          double best = 0;
          for (int n : counts)
            if (eligible(n)) best = std::max(best, efficiency(n));
          EXPECT_GE(efficiency(s), 0.85 * best);
          for (int n : counts) {
            if (n < s && eligible(n)) {
              EXPECT_LT(efficiency(n), 0.85 * best) << "fewer splits, " << n << ", fill as well";
            }
          }
        }
}

// ---- the merge of partial results (core/online_softmax.h; combine.cuh runs it) ---------------------------

struct Row {
  int d;                              // head dim
  std::vector<float> s;               // scores, -inf where masked
  std::vector<std::vector<float>> v;  // values [keys][d]
};

// The exact result over keys [a, b): O = sum softmax(s) v and LSE, in fp64; O = 0, LSE = -inf without a key.
void exact(const Row& r, int a, int b, std::vector<double>& o, double& lse) {
  const size_t d = size_t(r.d);
  double m = -INFINITY;
  for (int j = a; j < b; ++j) m = std::max(m, double(r.s[j]));
  o.assign(d, 0.0);
  if (m == -INFINITY) {
    lse = -INFINITY;
    return;
  }
  double l = 0;
  for (int j = a; j < b; ++j) {
    const double p = std::exp(double(r.s[j]) - m);
    l += p;
    for (size_t c = 0; c < d; ++c) o[c] += p * r.v[j][c];
  }
  for (double& x : o) x /= l;
  lse = m + std::log(l);
}

// The float state (m, l, acc) of keys [a, b), built key by key as the kernels do (online_rescale).
SoftmaxState part_state(const Row& r, int a, int b, std::vector<float>& acc) {
  SoftmaxState st;
  acc.assign(size_t(r.d), 0.0f);
  for (int j = a; j < b; ++j) {
    const float alpha = online_rescale(st, r.s[j]);
    const float p = safe_exp_diff(r.s[j], st.m);
    st.l += p;
    for (size_t c = 0; c < acc.size(); ++c) acc[c] = alpha * acc[c] + p * r.v[j][c];
  }
  return st;
}

// Rows of 1 .. 200 keys cut into 1 .. 40 splits at random places (empty splits included, and splits whose
// keys are all masked: a window or causal past their range), merged in a random order, in both of
// split-KV's forms: the states (m, l, acc) with merge_states and merge_acc, and the stored (LSE, O) with
// partial_state and combine.cuh's weights e^(LSE_s - m) / l. Both match the unsplit result in fp64.
TEST(SplitMerge, AnySplitMergesToTheUnsplitResult) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = int(uniform(rng, 0, 200)), d = int(uniform(rng, 1, 8)), splits = int(uniform(rng, 1, 40));
    Row r;
    r.d = d;
    r.s.resize(n);
    r.v.assign(n, std::vector<float>(d));
    const int masked_from = int(uniform(rng, 0, n)), masked_upto = int(uniform(rng, masked_from, n));
    for (int j = 0; j < n; ++j) {
      r.s[j] = j >= masked_from && j < masked_upto ? -INFINITY : normal(rng);
      for (float& x : r.v[j]) x = normal(rng);
    }
    std::vector<int> cut = {0, n};
    for (int k = 1; k < splits; ++k) cut.push_back(int(uniform(rng, 0, n)));
    std::sort(cut.begin(), cut.end());
    std::vector<int> order(splits);
    for (int k = 0; k < splits; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);

    std::vector<double> o_ref;
    double lse_ref;
    exact(r, 0, n, o_ref, lse_ref);
    SCOPED_TRACE("keys " + std::to_string(n) + " splits " + std::to_string(splits) + " masked " +
                 std::to_string(masked_from) + ".." + std::to_string(masked_upto));

    // (m, l, acc) states, merged in a random order.
    SoftmaxState st;
    std::vector<float> acc(d, 0.0f), part;
    // (LSE, O) as the splits store them, merged as combine.cuh does.
    std::vector<float> lse_part(splits);
    std::vector<std::vector<float>> o_part(splits);
    for (int k : order) {
      const SoftmaxState ps = part_state(r, cut[k], cut[k + 1], part);
      merge_acc(acc.data(), part.data(), d, merge_states(st, ps));
      lse_part[k] = row_lse(ps);
      o_part[k].resize(d);
      for (int c = 0; c < d; ++c) o_part[k][c] = part[c] * inv_l(ps);
    }
    SoftmaxState merged;
    for (int k : order) merge_states(merged, partial_state(lse_part[k]));
    const float inv = inv_l(merged), m = merged.m == -INFINITY ? 0.0f : merged.m;
    std::vector<float> o_combined(d, 0.0f);
    for (int k = 0; k < splits; ++k)
      for (int c = 0; c < d; ++c) o_combined[c] += std::exp(lse_part[k] - m) * inv * o_part[k][c];

    if (lse_ref == -INFINITY) {  // no visible key: O = 0 and LSE = -inf, in both forms
      EXPECT_EQ(row_lse(st), -INFINITY);
      EXPECT_EQ(row_lse(merged), -INFINITY);
      for (int c = 0; c < d; ++c) {
        EXPECT_EQ(acc[c] * inv_l(st), 0.0f);
        EXPECT_EQ(o_combined[c], 0.0f);
      }
      continue;
    }
    const double tol = 1e-5 * (1 + std::sqrt(double(n)));
    EXPECT_NEAR(row_lse(st), lse_ref, tol * (1 + std::abs(lse_ref)));
    EXPECT_NEAR(row_lse(merged), lse_ref, tol * (1 + std::abs(lse_ref)));
    double vmax = 1;
    for (const auto& v : r.v)
      for (float x : v) vmax = std::max(vmax, double(std::abs(x)));
    for (int c = 0; c < d; ++c) {
      EXPECT_NEAR(acc[c] * inv_l(st), o_ref[c], tol * vmax) << "column " << c << ", merged states";
      EXPECT_NEAR(o_combined[c], o_ref[c], tol * vmax) << "column " << c << ", merged (LSE, O)";
    }
  }
}

// The empty state (-inf, 0, 0), what a split that sees no key leaves, is the merge's identity, exactly: on
// either side the result is the other state, bit for bit.
TEST(SplitMerge, AnEmptySplitChangesNothing) {
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 1000; ++trial) {
    const SoftmaxState some{normal(rng), 1.0f + std::abs(normal(rng))};
    const float acc[3] = {normal(rng), normal(rng), normal(rng)};
    const float zero[3] = {0.0f, 0.0f, 0.0f};
    for (bool empty_first : {false, true}) {
      SoftmaxState st = empty_first ? partial_state(-INFINITY) : some;
      float out[3];
      std::copy(empty_first ? zero : acc, (empty_first ? zero : acc) + 3, out);
      merge_acc(out, empty_first ? acc : zero, 3, merge_states(st, empty_first ? some : SoftmaxState{}));
      EXPECT_EQ(st.m, some.m);
      EXPECT_EQ(st.l, some.l);
      for (int c = 0; c < 3; ++c) EXPECT_EQ(out[c], acc[c]);
    }
  }
  SoftmaxState none = partial_state(-INFINITY);
  merge_states(none, partial_state(-INFINITY));
  EXPECT_EQ(none.m, -INFINITY);
  EXPECT_EQ(none.l, 0.0f);
  EXPECT_EQ(row_lse(none), -INFINITY);
  EXPECT_EQ(inv_l(none), 0.0f);
}

}  // namespace
}  // namespace fa
