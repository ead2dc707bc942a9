// FlashAttention, step by step — tests of step 2: the online-softmax invariant.
// Property style: hundreds of seeded random heads (shapes, masks, scales, dropout) and random tilings
// (tiles of 1, tails, a single tile, tiles larger than N), each variant against step 1 in fp64; the merge's
// algebra; huge logits and masked rows; every variant through the harness's check with all features;
// both orders of the tiled backward (kv-outer, q-outer) against step 1's backward in fp64.
// The golden files of the three traces are checked by ctest (tests/CMakeLists.txt says how to regenerate them);
// here, that every trace agrees with step 1 whatever the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness/cli.h"
#include "harness/registry.h"
#include "step1_cpu_reference/reference.h"
#include "step2_online_softmax/online.h"

namespace fa {
namespace {

using step2::Head;
using step2::Partial;
constexpr float kInf = INFINITY;

// One random head (B = Hq = Hkv = 1), its inputs and output buffers.
struct Case {
  Problem p;
  Inputs in;
  Outputs out;  // o [1, 1, Nq, d], lse [1, 1, Nq]
  Head hd;
};

Case random_case(uint64_t seed, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  Case c;
  Problem& p = c.p;
  p.B = p.Hq = p.Hkv = 1;
  p.Nq = pick(1, 9);
  p.Nk = pick(1, 40);
  p.d = pick(1, 8);
  p.causal = pick(0, 1);
  p.input_pos = pick(-3, p.Nk);  // negative: the first rows see no key
  p.scale = float(pick(0, 1) ? 1.0 / std::sqrt(double(p.d)) : 10.0);
  p.dtype = DType::fp32;
  p.dropout = pick(0, 2) == 0 ? 0.3f : 0.0f;
  p.seed = seed;
  c.in = random_inputs(p);
  c.out.o = Tensor({1, 1, p.Nq, p.d}, NAN);
  c.out.lse = Tensor({1, 1, p.Nq}, NAN);
  c.hd = step2::head_of(p, c.in, c.out, 0, 0);
  return c;
}

// A tile: 1, a random size (tails), exactly N (a single tile), or larger than N.
int64_t random_tile(std::mt19937_64& rng, int64_t N) {
  switch (rng() % 4) {
    case 0: return 1;
    case 1: return 1 + int64_t(rng() % uint64_t(N));
    case 2: return N;
    default: return N + 1 + int64_t(rng() % 5);
  }
}

// O and LSE against step 1 in fp64: fully masked rows exactly 0 and -inf, the rest within a tolerance
// that grows with the logits (float rounds S = scale q.k relative to its size).
void expect_matches_step1(const Case& c, const std::string& what) {
  const auto ref = step1::attention<double>(c.p, c.in, false);
  const double tol = 2e-6 * std::max(1.0, double(c.p.scale) * 3 * c.p.d);
  for (int64_t i = 0; i < c.p.Nq; ++i) {
    if (std::isinf(ref.lse.data[i])) {
      ASSERT_EQ(c.out.lse.data[i], -kInf) << what << " row " << i;
      for (int64_t k = 0; k < c.p.d; ++k) ASSERT_EQ(c.out.o.data[i * c.p.d + k], 0.0f) << what << " row " << i;
      continue;
    }
    ASSERT_NEAR(c.out.lse.data[i], ref.lse.data[i], tol * std::max(1.0, std::fabs(ref.lse.data[i]))) << what << " row " << i;
    for (int64_t k = 0; k < c.p.d; ++k)
      ASSERT_NEAR(c.out.o.data[i * c.p.d + k], ref.o.data[i * c.p.d + k], tol) << what << " row " << i << " col " << k;
  }
}

constexpr uint64_t kSeeds = 300;

TEST(Step2Property, OnlineEqualsNaiveSoftmax) {
  std::mt19937_64 rng(1);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    Case c = random_case(seed, rng);
    const int64_t tile = random_tile(rng, c.p.Nk);
    step2::attention_online(c.hd, tile);
    expect_matches_step1(c, "online seed " + std::to_string(seed) + " tile " + std::to_string(tile));
  }
}

TEST(Step2Property, TwoPassEqualsThreePass) {
  std::mt19937_64 rng(2);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    Case c = random_case(seed, rng);
    step2::attention_3pass(c.hd);
    expect_matches_step1(c, "3pass seed " + std::to_string(seed));
    const Tensor o3 = c.out.o, lse3 = c.out.lse;
    const int64_t tile = random_tile(rng, c.p.Nk);
    step2::attention_2pass(c.hd, tile);
    for (size_t k = 0; k < o3.size(); ++k) ASSERT_NEAR(c.out.o.data[k], o3.data[k], 1e-5) << "seed " << seed << " tile " << tile;
    for (size_t k = 0; k < lse3.size(); ++k) {
      if (std::isinf(lse3.data[k])) ASSERT_EQ(c.out.lse.data[k], lse3.data[k]);
      else ASSERT_NEAR(c.out.lse.data[k], lse3.data[k], 1e-5 * std::max(1.0f, std::fabs(lse3.data[k])));
    }
  }
}

TEST(Step2Property, BothFlashLoopOrdersAnyBlockSizes) {
  std::mt19937_64 rng(3);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    Case c = random_case(seed, rng);
    const step2::Blocks bl{random_tile(rng, c.p.Nq), random_tile(rng, c.p.Nk)};
    const std::string blocks = " Br " + std::to_string(bl.Br) + " Bc " + std::to_string(bl.Bc);
    step2::attention_fa1(c.hd, bl);
    expect_matches_step1(c, "fa1 seed " + std::to_string(seed) + blocks);
    step2::attention_fa2(c.hd, bl);
    expect_matches_step1(c, "fa2 seed " + std::to_string(seed) + blocks);
  }
}

TEST(Step2Property, SplitKvMergesToTheWhole) {
  std::mt19937_64 rng(4);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    Case c = random_case(seed, rng);
    const int64_t splits = 1 + int64_t(rng() % 6), tile = random_tile(rng, c.p.Nk);
    step2::attention_split_kv(c.hd, splits, tile);
    expect_matches_step1(c, "split-KV seed " + std::to_string(seed) + " splits " + std::to_string(splits));
  }
}

// m is a max, exact in any order of the same scores; `whole` recomputes the scores with other tile
// boundaries, which may round differently in the last bit.
void expect_same_state(const Partial& a, const Partial& b, const std::string& what, bool same_scores = true) {
  if (same_scores || std::isinf(b.st.m)) ASSERT_EQ(a.st.m, b.st.m) << what;
  else ASSERT_NEAR(a.st.m, b.st.m, 1e-6f * std::max(1.0f, std::fabs(b.st.m))) << what;
  ASSERT_NEAR(a.st.l, b.st.l, 1e-5f * std::max(1.0f, b.st.l)) << what;
  for (size_t k = 0; k < a.acc.size(); ++k) ASSERT_NEAR(a.acc[k], b.acc[k], 1e-5f * std::max(1.0f, b.st.l)) << what;
}

TEST(Step2Property, MergeIsAssociativeCommutativeWithTheEmptyStateAsIdentity) {
  std::mt19937_64 rng(5);
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const Case c = random_case(seed, rng);
    const int64_t Nk = c.p.Nk, i = int64_t(rng() % uint64_t(c.p.Nq)), tile = random_tile(rng, Nk);
    int64_t x = int64_t(rng() % uint64_t(Nk + 1)), y = int64_t(rng() % uint64_t(Nk + 1));  // may be empty ranges
    if (x > y) std::swap(x, y);
    const Partial a = step2::online_partial(c.hd, i, 0, x, tile), b = step2::online_partial(c.hd, i, x, y, tile),
                  e = step2::online_partial(c.hd, i, y, Nk, tile), whole = step2::online_partial(c.hd, i, 0, Nk, tile);
    const std::string what = "seed " + std::to_string(seed);
    Partial ab_c = a, bc = b, a_bc = a, ab = a, ba = b;
    step2::merge(ab_c, b);
    step2::merge(ab_c, e);
    step2::merge(bc, e);
    step2::merge(a_bc, bc);
    expect_same_state(ab_c, a_bc, "associative, " + what);
    expect_same_state(ab_c, whole, "split equals whole, " + what, false);
    step2::merge(ab, b);
    step2::merge(ba, a);
    expect_same_state(ab, ba, "commutative, " + what);
    for (const Partial* s : {&a, &b, &whole}) {  // identity: exact, on both sides
      const Partial empty{SoftmaxState{}, std::vector<float>(size_t(c.p.d), 0.0f)};
      Partial left = *s, right = empty;
      step2::merge(left, empty);
      step2::merge(right, *s);
      for (const Partial* r : {&left, &right}) {
        ASSERT_EQ(r->st.m, s->st.m) << what;
        ASSERT_EQ(r->st.l, s->st.l) << what;
        ASSERT_EQ(r->acc, s->acc) << what;
      }
    }
  }
}

// Logits of +-1e4 and masked entries, with exact integer scores (d = 1, scale 1) so fp64 is comparable.
TEST(Step2, HugeLogitsAndMaskedRowsGiveNoNanAndMatchStep1) {
  std::mt19937_64 rng(6);
  Case c = random_case(0, rng);
  Problem& p = c.p;
  p.Nq = 4, p.Nk = 7, p.d = 1, p.causal = true, p.input_pos = -1, p.scale = 1.0f, p.dropout = 0.0f;
  c.in.q = Tensor({1, 1, 4, 1});
  c.in.q.data = {100, -100, 99, -99};  // row 0 sees no key (position -1)
  c.in.k = Tensor({1, 1, 7, 1});
  c.in.k.data = {100, -100, 97, 100, -3, 50, -100};
  c.in.v = Tensor({1, 1, 7, 1});
  c.in.v.data = {1, -2, 3, -4, 5, -6, 7};
  c.out.o = Tensor({1, 1, 4, 1});
  c.out.lse = Tensor({1, 1, 4});
  Head& hd = c.hd;
  hd.q = c.in.q.ptr(), hd.k = c.in.k.ptr(), hd.v = c.in.v.ptr(), hd.o = c.out.o.ptr(), hd.lse = c.out.lse.ptr();
  hd.Nq = 4, hd.Nk = 7, hd.d = 1, hd.mod.causal = true, hd.mod.input_pos = -1, hd.scale = 1.0f, hd.drop = {};
  const std::vector<std::pair<std::string, std::function<void()>>> runs = {
      {"3pass", [&] { step2::attention_3pass(c.hd); }},
      {"2pass", [&] { step2::attention_2pass(c.hd, 2); }},
      {"online", [&] { step2::attention_online(c.hd, 1); }},
      {"fa1", [&] { step2::attention_fa1(c.hd, {3, 2}); }},
      {"fa2", [&] { step2::attention_fa2(c.hd, {3, 2}); }},
      {"split-KV", [&] { step2::attention_split_kv(c.hd, 3, 2); }}};
  for (const auto& [name, run] : runs) {
    std::fill(c.out.o.data.begin(), c.out.o.data.end(), NAN);
    run();
    for (float x : c.out.o.data) ASSERT_TRUE(std::isfinite(x)) << name;
    ASSERT_EQ(c.out.lse.data[0], -kInf) << name << ": the fully masked row";
    ASSERT_EQ(c.out.o.data[0], 0.0f) << name << ": the fully masked row";
    for (int i = 1; i < 4; ++i) ASSERT_TRUE(std::isfinite(c.out.lse.data[i]) && std::fabs(c.out.lse.data[i]) > 9000) << name;
    expect_matches_step1(c, name);
  }
}

TEST(Step2, BlockSizesFromTheOnChipBudget) {
  auto eq = [](step2::Blocks b, int64_t Br, int64_t Bc) { return b.Br == Br && b.Bc == Bc; };
  EXPECT_TRUE(eq(step2::blocks_from_budget(20, 2), 2, 3));  // the trace's M = 20, d = 2
  EXPECT_TRUE(eq(step2::blocks_from_budget(16384, 64), 64, 64));
  EXPECT_TRUE(eq(step2::blocks_from_budget(16384, 128), 32, 32));
  EXPECT_TRUE(eq(step2::blocks_from_budget(16384, 16), 16, 256));
  EXPECT_TRUE(eq(step2::blocks_from_budget(1, 64), 1, 1));
}

TEST(Step2, FootprintShowsTheFourfoldReduction) {
  const std::string t = step2::footprint_table(1024, 1024, 64, 256, 16384);
  EXPECT_NE(t.find("3pass   total                                              1026"), std::string::npos) << t;
  EXPECT_NE(t.find("online  total                                               258"), std::string::npos) << t;
  EXPECT_NE(t.find("0.25x of 3pass"), std::string::npos) << t;
}

// Every trace ends by comparing with step 1 ("... < 1e-6: yes"); the golden files fix seed 0, this any seed.
TEST(Step2, EveryTraceAgreesWithStep1ForAnySeed) {
  auto count = [](const std::string& t, const std::string& what) {
    size_t n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  };
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string fa2 = step2::trace(seed), fa1 = step2::trace_fa1(seed), bwd = step2::trace_backward(seed);
    EXPECT_EQ(count(fa2, ": yes\n"), 3u) << "seed " << seed << "\n" << fa2;  // no mask, causal, split-KV
    EXPECT_EQ(count(fa1, ": yes\n"), 1u) << "seed " << seed << "\n" << fa1;  // dropout
    EXPECT_EQ(count(bwd, ": yes\n"), 2u) << "seed " << seed << "\n" << bwd;  // no mask, causal
    for (const std::string* t : {&fa2, &fa1, &bwd}) EXPECT_EQ(count(*t, "NO\n"), 0u) << "seed " << seed;
  }
}

// ---- the tiled backward ----------------------------------------------------------------------------

// A random problem for the backward: GQA (g = Hq / Hkv of 1 to 3), Nq and Nk on either side of each other,
// causal with input_pos from -3 (rows that see nothing) to past Nk, dropout, in fp32.
Problem random_backward_problem(uint64_t seed, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  Problem p;
  p.B = pick(1, 2);
  p.Hkv = pick(1, 2);
  p.Hq = p.Hkv * pick(1, 3);
  p.Nq = pick(1, 40);
  p.Nk = pick(1, 40);
  p.d = pick(1, 8);
  p.causal = pick(0, 1);
  p.input_pos = pick(-3, p.Nk);
  p.scale = float(pick(0, 1) ? 1.0 / std::sqrt(double(p.d)) : 1.0);
  p.dtype = DType::fp32;
  p.dropout = pick(0, 2) == 0 ? 0.3f : 0.0f;
  p.seed = seed;
  p.backward = true;
  p.validate();
  return p;
}

// Forward with fa2 (O and LSE), then the backward in `order` with blocks bl.
Outputs run_backward(const Problem& p, const Inputs& in, step2::Order order, step2::Blocks bl) {
  Outputs out = step2::attention(p, in, "fa2", step2::Config{});
  step2::backward(p, in, order, bl, out);
  return out;
}

// dQ, dK, dV against step 1's backward in fp64: within 1e-4 of the largest gradient of each tensor (at least
// 1), and exactly 0 in the dQ rows of a query that sees no key (LSE = -inf).
void expect_gradients_match_step1(const Problem& p, const Inputs& in, const Outputs& got, const std::string& what) {
  const auto ref = step1::attention<double>(p, in, true);
  const std::pair<const char*, std::pair<const Tensor*, const TensorT<double>*>> grads[] = {
      {"dQ", {&got.dq, &ref.dq}}, {"dK", {&got.dk, &ref.dk}}, {"dV", {&got.dv, &ref.dv}}};
  for (const auto& [name, g] : grads) {
    const auto& [a, b] = g;
    ASSERT_EQ(a->size(), b->size()) << what << " " << name;
    double largest = 1.0;
    for (double x : b->data) largest = std::max(largest, std::fabs(x));
    for (size_t k = 0; k < a->size(); ++k) {
      ASSERT_TRUE(std::isfinite(a->data[k])) << what << " " << name << " element " << k;
      ASSERT_NEAR(a->data[k], b->data[k], 1e-4 * largest) << what << " " << name << " element " << k;
    }
  }
  for (size_t r = 0; r < ref.lse.size(); ++r) {
    if (!std::isinf(ref.lse.data[r])) continue;
    for (int64_t c = 0; c < p.d; ++c) ASSERT_EQ(got.dq.data[r * size_t(p.d) + size_t(c)], 0.0f) << what << " row " << r;
  }
}

std::string describe(const Problem& p, step2::Order order, step2::Blocks bl) {
  return std::string(step2::order_name(order)) + " Br " + std::to_string(bl.Br) + " Bc " + std::to_string(bl.Bc) +
         " " + p.describe();
}

constexpr step2::Order kOrders[] = {step2::Order::kv_outer, step2::Order::q_outer};

TEST(Step2Backward, BothOrdersMatchStep1OnRandomProblemsAndTilings) {
  std::mt19937_64 rng(7);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const Problem p = random_backward_problem(seed, rng);
    const Inputs in = random_inputs(p);
    const step2::Blocks bl{random_tile(rng, p.Nq), random_tile(rng, p.Nk)};
    for (step2::Order order : kOrders)
      expect_gradients_match_step1(p, in, run_backward(p, in, order, bl), describe(p, order, bl));
  }
}

// The fixed cases the random ones may miss: N = 37 with tiles of 8 and 16 (tails), a negative input_pos
// (the first rows see no key), GQA with dropout, Nq < Nk and Nq > Nk.
TEST(Step2Backward, TailsMaskedRowsGqaDropoutAndUnequalLengths) {
  struct Shape {
    int64_t Hq, Hkv, Nq, Nk;
    bool causal;
    int64_t input_pos;
    float dropout;
  };
  const Shape shapes[] = {
      {2, 2, 37, 37, false, 0, 0.0f},  // tails
      {2, 2, 37, 37, true, 0, 0.0f},   // causal, square
      {2, 1, 37, 37, true, -5, 0.0f},  // rows 0 to 4 see no key
      {4, 2, 37, 37, false, 0, 0.2f},  // GQA with dropout
      {3, 1, 37, 37, true, 3, 0.2f},   // all of it
      {2, 2, 13, 37, true, 24, 0.1f},  // Nq < Nk: the last 13 queries of a 37-token prefix
      {2, 1, 37, 13, true, -24, 0.1f}, // Nq > Nk: the default input_pos masks the first 24 rows whole
  };
  for (const Shape& s : shapes) {
    Problem p;
    p.B = 2, p.Hq = s.Hq, p.Hkv = s.Hkv, p.Nq = s.Nq, p.Nk = s.Nk, p.d = 8, p.causal = s.causal;
    p.input_pos = s.input_pos, p.scale = 0.4f, p.dtype = DType::fp32, p.dropout = s.dropout, p.seed = 11;
    p.backward = true;
    p.validate();
    const Inputs in = random_inputs(p);
    for (step2::Blocks bl : {step2::Blocks{8, 16}, step2::Blocks{16, 8}, step2::Blocks{8, 8}, step2::Blocks{1, 37}})
      for (step2::Order order : kOrders)
        expect_gradients_match_step1(p, in, run_backward(p, in, order, bl), describe(p, order, bl));
  }
}

// The two orders sum the same products in another order: equal up to float rounding.
TEST(Step2Backward, BothOrdersAgree) {
  std::mt19937_64 rng(8);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const Problem p = random_backward_problem(seed, rng);
    const Inputs in = random_inputs(p);
    const step2::Blocks bl{random_tile(rng, p.Nq), random_tile(rng, p.Nk)};
    const Outputs a = run_backward(p, in, step2::Order::kv_outer, bl), b = run_backward(p, in, step2::Order::q_outer, bl);
    for (const auto& [x, y] : {std::pair{&a.dq, &b.dq}, std::pair{&a.dk, &b.dk}, std::pair{&a.dv, &b.dv}})
      for (size_t k = 0; k < x->size(); ++k)
        ASSERT_NEAR(x->data[k], y->data[k], 1e-5f * std::max(1.0f, std::fabs(y->data[k]))) << describe(p, step2::Order::kv_outer, bl);
  }
}

// Every variant through the harness's check against step 1, with every feature.
struct Features {
  int64_t Nq, Nk, group, input_pos;  // input_pos: INT64_MIN = not causal, INT64_MAX = causal with the default
  float dropout;
};

class Step2Features : public ::testing::TestWithParam<Features> {};

// The problem of a feature case: 2 batches x 4 query heads, d = 8, scale 0.4.
Problem features_problem(const Features& f, DType dt, bool backward) {
  Problem p;
  p.B = 2, p.Hq = 4, p.Hkv = 4 / f.group, p.Nq = f.Nq, p.Nk = f.Nk, p.d = 8, p.dtype = dt;
  p.causal = f.input_pos != INT64_MIN;
  p.input_pos = f.input_pos == INT64_MAX || !p.causal ? p.Nk - p.Nq : f.input_pos;
  p.scale = 0.4f, p.dropout = f.dropout, p.seed = 77, p.backward = backward;
  p.validate();
  return p;
}

TEST_P(Step2Features, EveryVariantPassesTheCheckAgainstStep1) {
  const Features f = GetParam();
  for (DType dt : {DType::fp32, DType::bf16}) {
    const Problem p = features_problem(f, dt, false);
    const Inputs in = random_inputs(p);
    const step2::Config cfg{3, 40};  // tiles of 3 keys; Bc = ceil(40 / 32) = 2, Br = 2
    for (const std::string& v : step2::stage().variants) {
      const CheckReport r = check_against_reference(p, in, step2::attention(p, in, v, cfg));
      EXPECT_TRUE(r.pass) << v << " " << p.describe() << ": O err " << r.stage[0].max_abs << " LSE err "
                          << r.stage[1].max_abs;
    }
  }
}

TEST_P(Step2Features, BothBackwardOrdersPassTheCheckAgainstStep1) {
  const Features f = GetParam();
  for (DType dt : {DType::fp32, DType::bf16}) {
    const Problem p = features_problem(f, dt, true);
    const Inputs in = random_inputs(p);
    const std::unique_ptr<Runner> runners[] = {step2::stage().make(p, in, "fa1"), step2::stage().make(p, in, "fa2")};
    for (const auto& runner : runners) {
      runner->run();
      runner->run_backward();
      const CheckReport r = check_against_reference(p, in, runner->outputs());
      EXPECT_TRUE(r.pass) << p.describe() << ": dQ err " << r.stage[2].max_abs << " dK err " << r.stage[3].max_abs
                          << " dV err " << r.stage[4].max_abs;
    }
  }
}

std::vector<Features> features() {
  std::vector<Features> fs;
  for (int64_t group : {1, 2, 4})
    for (int64_t pos : {INT64_MIN, INT64_MAX, int64_t(0), int64_t(3), int64_t(-2)})
      for (float drop : {0.0f, 0.3f}) fs.push_back({5, 9, group, pos, drop});
  fs.push_back({7, 7, 2, INT64_MAX, 0.1f});  // square causal
  fs.push_back({9, 4, 1, INT64_MAX, 0.0f});  // Nq > Nk: the default input_pos < 0 masks whole rows
  return fs;
}

std::string features_name(const ::testing::TestParamInfo<Features>& info) {
  const Features& f = info.param;
  std::string n = "Nq" + std::to_string(f.Nq) + "_Nk" + std::to_string(f.Nk) + "_G" + std::to_string(f.group);
  if (f.input_pos == INT64_MAX) n += "_causal_default";
  else if (f.input_pos != INT64_MIN) n += "_causal_pos" + std::string(f.input_pos < 0 ? "m" : "") + std::to_string(std::abs(f.input_pos));
  if (f.dropout > 0) n += "_dropout";
  return n;
}

INSTANTIATE_TEST_SUITE_P(AllFeatures, Step2Features, ::testing::ValuesIn(features()), features_name);

// ---- score modifiers and masks (core/score_mod.h) ----------------------------------------------------

// A random problem with random score modifiers: a bias of a random broadcast shape (some entries -inf),
// ALiBi (the standard slopes or given ones), a softcap, a sliding window (either side unbounded or not),
// on top of random_backward_problem's GQA, causal masks, input_pos and dropout.
Problem random_mods_problem(uint64_t seed, std::mt19937_64& rng, Inputs& in) {
  auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
  Problem p = random_backward_problem(seed, rng);
  p.bias = pick(0, 1);
  p.alibi = pick(0, 2) == 0;
  p.softcap = pick(0, 2) == 0 ? float(pick(1, 20)) : 0.0f;
  if (pick(0, 1)) {
    p.window_left = pick(-1, 12);
    p.window_right = pick(-1, 12);
  }
  p.validate();
  in = random_inputs(p);
  if (p.bias) {
    const int64_t bB = pick(0, 1) ? p.B : 1, bH = pick(0, 1) ? p.Hq : 1;
    in.bias = random_tensor({bB, bH, p.Nq, p.Nk}, seed, 9, 0.0f, DType::fp32);
    for (float& x : in.bias.data)
      if (rng() % 16 == 0) x = -kInf;  // a mask given as a bias
  }
  if (p.alibi && pick(0, 1)) {
    in.alibi_slopes = Tensor({p.Hq});
    for (float& x : in.alibi_slopes.data) x = float(pick(1, 100)) / 100.0f;
  }
  return p;
}

// O and LSE of a whole problem against step 1 in fp64: fully masked rows exactly 0 and -inf.
void expect_outputs_match_step1(const Problem& p, const Inputs& in, const Outputs& got, const std::string& what) {
  const auto ref = step1::attention<double>(p, in, false);
  ASSERT_EQ(got.lse.size(), ref.lse.size()) << what;
  for (size_t r = 0; r < ref.lse.size(); ++r) {
    if (std::isinf(ref.lse.data[r])) {
      ASSERT_EQ(got.lse.data[r], -kInf) << what << " row " << r;
      for (int64_t c = 0; c < p.d; ++c) ASSERT_EQ(got.o.data[r * size_t(p.d) + size_t(c)], 0.0f) << what << " row " << r;
      continue;
    }
    ASSERT_NEAR(got.lse.data[r], ref.lse.data[r], 2e-5 * std::max(1.0, std::fabs(ref.lse.data[r]))) << what << " row " << r;
    for (int64_t c = 0; c < p.d; ++c) {
      const size_t k = r * size_t(p.d) + size_t(c);
      ASSERT_NEAR(got.o.data[k], ref.o.data[k], 2e-5) << what << " row " << r << " col " << c;
    }
  }
}

// dBias against step 1's in fp64 (shaped like the bias: summed over its broadcast dimensions), within 1e-4
// of the largest element (at least 1); empty without a bias.
void expect_dbias_matches_step1(const Problem& p, const Inputs& in, const Outputs& got, const std::string& what) {
  const auto ref = step1::attention<double>(p, in, true);
  if (!p.bias) {
    EXPECT_TRUE(got.dbias.empty()) << what;
    return;
  }
  ASSERT_EQ(got.dbias.shape, in.bias.shape) << what;
  ASSERT_EQ(got.dbias.size(), ref.dbias.size()) << what;
  double largest = 1.0;
  for (double x : ref.dbias.data) largest = std::max(largest, std::fabs(x));
  for (size_t k = 0; k < ref.dbias.size(); ++k) {
    ASSERT_TRUE(std::isfinite(got.dbias.data[k])) << what << " dBias element " << k;
    ASSERT_NEAR(got.dbias.data[k], ref.dbias.data[k], 1e-4 * largest) << what << " dBias element " << k;
  }
}

std::string mods_str(const Problem& p) {
  return p.describe() + " bias " + std::to_string(p.bias) + " alibi " + std::to_string(p.alibi) + " softcap " +
         std::to_string(p.softcap) + " window " + std::to_string(p.window_left) + "," + std::to_string(p.window_right);
}

TEST(Step2Mods, EveryVariantMatchesStep1OnRandomModifiersAndTilings) {
  std::mt19937_64 rng(9);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Inputs in;
    const Problem p = random_mods_problem(seed, rng, in);
    const step2::Config cfg{random_tile(rng, p.Nk), 1 + int64_t(rng() % 200)};  // budget: Bc = ceil(M / 4d)
    for (const std::string& v : step2::stage().variants)
      expect_outputs_match_step1(p, in, step2::attention(p, in, v, cfg),
                                 v + " tile " + std::to_string(cfg.tile) + " budget " + std::to_string(cfg.budget) +
                                     " seed " + std::to_string(seed) + " " + mods_str(p));
  }
}

TEST(Step2Mods, BothBackwardOrdersMatchStep1WithDbiasOnRandomModifiersAndTilings) {
  std::mt19937_64 rng(10);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Inputs in;
    const Problem p = random_mods_problem(seed, rng, in);
    const step2::Blocks bl{random_tile(rng, p.Nq), random_tile(rng, p.Nk)};
    for (step2::Order order : kOrders) {
      const Outputs out = run_backward(p, in, order, bl);
      const std::string what = describe(p, order, bl) + " seed " + std::to_string(seed) + " " + mods_str(p);
      expect_gradients_match_step1(p, in, out, what);
      expect_dbias_matches_step1(p, in, out, what);
    }
  }
}

// The named combinations through the harness's check (O, LSE, dQ, dK, dV, dBias), fp32 and bf16, every
// forward variant and both backward orders.
struct ModCase {
  std::string name;
  int64_t Hq, Hkv;
  bool causal;
  int64_t biasB, biasH;  // the bias's leading dims (1: broadcast); 0: no bias
  bool alibi;
  float softcap;
  int64_t wl, wr;
  float dropout;
};

TEST(Step2Mods, NamedCombinationsPassTheCheckAgainstStep1) {
  const ModCase cases[] = {
      // name                    Hq Hkv causal bB bH alibi softcap wl  wr  dropout
      {"window",                  4, 4, false, 0, 0, false, 0.0f,  3,  2, 0.0f},
      {"window_left_only",        4, 4, false, 0, 0, false, 0.0f,  4, -1, 0.0f},
      {"window_with_causal",      4, 2, true,  0, 0, false, 0.0f,  3, -1, 0.0f},
      {"alibi_gqa",               6, 2, false, 0, 0, true,  0.0f, -1, -1, 0.0f},
      {"alibi_gqa_causal",        4, 1, true,  0, 0, true,  0.0f, -1, -1, 0.0f},
      {"bias_full",               4, 2, false, 2, 4, false, 0.0f, -1, -1, 0.0f},
      {"bias_over_batch",         4, 2, false, 1, 4, false, 0.0f, -1, -1, 0.0f},
      {"bias_over_heads",         4, 2, true,  2, 1, false, 0.0f, -1, -1, 0.0f},
      {"bias_over_batch_heads",   4, 4, false, 1, 1, false, 0.0f, -1, -1, 0.0f},
      {"softcap",                 4, 4, false, 0, 0, false, 2.0f, -1, -1, 0.0f},
      {"softcap_dropout",         4, 2, true,  0, 0, false, 2.0f, -1, -1, 0.2f},
      {"all",                     4, 2, true,  1, 4, true,  5.0f,  4, -1, 0.1f},
  };
  for (const ModCase& c : cases)
    for (DType dt : {DType::fp32, DType::bf16})
      for (bool bwd : {false, true}) {
        Problem p;
        p.B = 2, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Nq = 11, p.Nk = 13, p.d = 8, p.dtype = dt;
        p.causal = c.causal, p.input_pos = p.Nk - p.Nq, p.scale = 0.4f, p.dropout = c.dropout, p.seed = 5;
        p.bias = c.biasB > 0, p.alibi = c.alibi, p.softcap = c.softcap, p.window_left = c.wl, p.window_right = c.wr;
        p.backward = bwd;
        p.validate();
        Inputs in = random_inputs(p);
        if (p.bias) in.bias = random_tensor({c.biasB, c.biasH, p.Nq, p.Nk}, p.seed, 9, 0.0f, DType::fp32);
        const step2::Config cfg{3, 40};  // tiles of 3 keys; Bc = ceil(40 / 32) = 2, Br = 2: tails everywhere
        for (const std::string& v : step2::stage().variants) {
          if (!step2::stage().unsupported(p, v).empty()) continue;  // the backward: fa1 and fa2
          const std::unique_ptr<Runner> runner = step2::stage(cfg).make(p, in, v);
          runner->run();
          if (bwd) runner->run_backward();
          const Outputs out = runner->outputs();
          const CheckReport r = check_against_reference(p, in, out);
          EXPECT_TRUE(r.pass) << c.name << " " << v << " " << p.describe() << ": O " << r.stage[0].max_abs << " LSE "
                              << r.stage[1].max_abs << " dQ " << r.stage[2].max_abs << " dK " << r.stage[3].max_abs
                              << " dV " << r.stage[4].max_abs << " dBias " << r.stage[5].max_abs;
          if (bwd && p.bias) {
            EXPECT_EQ(out.dbias.shape, in.bias.shape) << c.name << " " << v;
          }
        }
      }
}

// A sliding window skips the K/V blocks no row of a Q block sees, in the forward (fa2) and the backward
// (kv-outer): exactly the blocks with no visible (i, j), counted through the trace's observers.
void count_visit(const step2::Visit&, void* n) { ++*static_cast<int64_t*>(n); }
void count_backward_visit(const step2::BackwardVisit&, void* n) { ++*static_cast<int64_t*>(n); }

TEST(Step2Mods, WindowSkipsTheBlocksOutsideIt) {
  std::mt19937_64 rng(11);
  for (uint64_t seed = 0; seed < 100; ++seed) {
    auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
    Problem p;
    p.B = p.Hq = p.Hkv = 1, p.Nq = pick(1, 64), p.Nk = pick(1, 64), p.d = 4, p.dtype = DType::fp32, p.scale = 0.5f;
    p.causal = pick(0, 1), p.input_pos = pick(-3, p.Nk), p.seed = seed, p.backward = true;
    p.window_left = pick(0, 10), p.window_right = pick(-1, 10);
    p.validate();
    const Inputs in = random_inputs(p);
    const step2::Blocks bl{pick(1, 9), pick(1, 9)};
    Outputs out;
    out.o = Tensor({1, 1, p.Nq, p.d});
    out.lse = Tensor({1, 1, p.Nq});
    const Head hd = step2::head_of(p, in, out, 0, 0);
    const ScoreMod mod = score_mod_of(p);
    int64_t needed = 0, all = 0;
    for (int64_t i0 = 0; i0 < p.Nq; i0 += bl.Br)
      for (int64_t j0 = 0; j0 < p.Nk; j0 += bl.Bc) {
        bool any = false;
        for (int64_t i = i0; i < std::min(i0 + bl.Br, p.Nq); ++i)
          for (int64_t j = j0; j < std::min(j0 + bl.Bc, p.Nk); ++j) any = any || visible(mod, i, j);
        needed += any;
        ++all;
      }
    const std::string what = "seed " + std::to_string(seed) + " Br " + std::to_string(bl.Br) + " Bc " +
                             std::to_string(bl.Bc) + " " + mods_str(p);
    int64_t forward = 0;
    step2::attention_fa2(hd, bl, count_visit, &forward);
    EXPECT_EQ(forward, needed) << what;
    expect_outputs_match_step1(p, in, out, what);
    out.dq = Tensor({1, 1, p.Nq, p.d});
    out.dk = Tensor({1, 1, p.Nk, p.d});
    out.dv = Tensor({1, 1, p.Nk, p.d});
    const Head bh = step2::head_of(p, in, out, 0, 0);
    int64_t backward = 0;
    step2::backward_kv_outer({bh}, bl, count_backward_visit, &backward);
    EXPECT_EQ(backward, needed) << what;
    if (p.Nq >= 3 * bl.Br && p.Nk >= 3 * bl.Bc && p.window_left < bl.Bc && p.window_right >= 0 &&
        p.window_right < bl.Bc && p.input_pos == 0) {
      EXPECT_LT(needed, all) << what;  // a narrow band leaves blocks out
    }
  }
}

}  // namespace
}  // namespace fa
