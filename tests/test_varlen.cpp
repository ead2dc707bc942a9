// FlashAttention, step by step — tests of packed variable-length batches (core/varlen.h) in steps 1 and 2.
// The packed result equals each sequence run alone as a dense problem written out here by hand (B = 1, its
// rows copied out, causal bottom-right: input_pos = Lk - Lq): exactly, since the same code runs on the same
// numbers. Step 1's packed forward also equals plain fp64 loops over the packed layout and its mask, written
// from flash_attn_varlen_func's definition alone. Step 2 passes the tolerance rule against step 1 run the same
// way. The batches hold sequences of length 0 (no queries, no keys, neither) and 1, and Lq != Lk both ways;
// the problems GQA, causal, a window, a softcap and ALiBi. Then: the tiles step 2's tiled loops visit are the
// tiles with a visible (query, key) pair, counted by brute force; and every malformed description and flag is
// refused with its message.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/random.h"
#include "core/score_mod.h"
#include "core/varlen.h"
#include "harness/registry.h"
#include "step1_cpu_reference/reference.h"
#include "step2_online_softmax/online.h"
#include "tests/cli_run.h"

namespace fa {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Batch {
  const char* name;
  std::vector<int64_t> lq, lk;
};
// mixed: Lq < Lk; no queries (its 4 keys get dK = dV = 0); 1 and 1; Lq < Lk; 3 queries and no keys (O = 0,
// LSE = -inf, dQ = 0); nothing at all; Lq > Lk (causal: the first 5 rows see no key).
const Batch kBatches[] = {
    {"mixed", {5, 0, 1, 7, 3, 0, 9}, {7, 4, 1, 13, 0, 0, 4}},
    {"one_sequence", {6}, {6}},
    {"length_one_queries", {1, 1, 1}, {1, 2, 3}},
};

struct Mods {
  const char* name;
  int64_t Hq, Hkv;
  bool causal;
  int64_t wl, wr;
  float softcap;
  bool alibi;
};
const Mods kMods[] = {
    // name                         Hq Hkv causal wl  wr  softcap alibi
    {"plain",                        2, 2, false, -1, -1, 0.0f, false},
    {"causal",                       2, 2, true,  -1, -1, 0.0f, false},
    {"causal_gqa",                   4, 2, true,  -1, -1, 0.0f, false},
    {"gqa4_window",                  4, 1, false,  3,  2, 0.0f, false},
    {"causal_window_softcap_gqa",    4, 2, true,   2, -1, 5.0f, false},
    {"alibi_causal_gqa",             4, 2, true,  -1, -1, 0.0f, true},
};

Problem make_problem(const Mods& m, DType dt, bool backward) {
  Problem p;
  p.Hq = m.Hq, p.Hkv = m.Hkv, p.d = 8, p.causal = m.causal, p.window_left = m.wl, p.window_right = m.wr;
  p.softcap = m.softcap, p.alibi = m.alibi, p.scale = 0.4f, p.dtype = dt, p.seed = 3, p.backward = backward;
  return p;
}

std::string what(const Batch& b, const Mods& m, const std::string& more = "") {
  return std::string(b.name) + " " + m.name + (more.empty() ? "" : " " + more);
}

// ---- each sequence alone, written out by hand ----------------------------------------------------------

// Rows r0 .. r0 + L - 1 of a packed [total, H, d] tensor as a dense [1, H, L, d] one.
Tensor rows_of(const Tensor& packed, int64_t r0, int64_t L) {
  const int64_t H = packed.shape[1], d = packed.shape[2];
  Tensor t({1, H, L, d});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < d; ++c) t.data[size_t((h * L + i) * d + c)] = packed.data[size_t(((r0 + i) * H + h) * d + c)];
  return t;
}

// Sequence b of the batch as a dense problem and its inputs, as a user would run it alone.
struct Alone {
  Problem p;
  Inputs in;
  int64_t q0, k0;  // its first packed query row and key row
};
Alone alone(const Problem& base, const Varlen& v, const Inputs& packed, int64_t b) {
  Alone a;
  a.q0 = v.cu_seqlens_q[size_t(b)], a.k0 = v.cu_seqlens_k[size_t(b)];
  const int64_t Lq = v.cu_seqlens_q[size_t(b + 1)] - a.q0, Lk = v.cu_seqlens_k[size_t(b + 1)] - a.k0;
  a.p = base;
  a.p.B = 1, a.p.Nq = Lq, a.p.Nk = Lk, a.p.input_pos = Lk - Lq;  // bottom-right in its own keys
  a.in.q = rows_of(packed.q, a.q0, Lq);
  a.in.k = rows_of(packed.k, a.k0, Lk);
  a.in.v = rows_of(packed.v, a.k0, Lk);
  if (base.backward) a.in.dout = rows_of(packed.dout, a.q0, Lq);
  a.in.alibi_slopes = packed.alibi_slopes;
  return a;
}

// Packed rows r0 .. of `packed` [total, H, d] against the dense [1, H, L, d] `dense`: exactly equal.
template <typename T>
void expect_rows_equal(const TensorT<T>& packed, int64_t r0, const TensorT<T>& dense, const std::string& w) {
  const int64_t H = packed.shape[1], d = packed.shape[2], L = dense.shape[2];
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < d; ++c)
        ASSERT_EQ(packed.data[size_t(((r0 + i) * H + h) * d + c)], dense.data[size_t((h * L + i) * d + c)])
            << w << " head " << h << " row " << i << " col " << c;
}

// Rows r0 .. r0 + L - 1 of `packed` hold `value` (0 for the outputs of a sequence that did not run).
template <typename T>
void expect_rows_are(const TensorT<T>& packed, int64_t r0, int64_t L, T value, const std::string& w) {
  const int64_t H = packed.shape[1], d = packed.shape[2];
  for (int64_t k = r0 * H * d; k < (r0 + L) * H * d; ++k) ASSERT_EQ(packed.data[size_t(k)], value) << w << " element " << k;
}

// The packed outputs against each sequence run alone by `dense` (Problem, Inputs -> OutputsT<T>).
template <typename T, typename Dense>
void expect_equals_each_sequence_alone(const Problem& p, const Varlen& v, const Inputs& packed,
                                       const OutputsT<T>& got, const Dense& dense, const std::string& w) {
  ASSERT_EQ(got.o.shape, (std::vector<int64_t>{v.total_q(), p.Hq, p.d})) << w;
  ASSERT_EQ(got.lse.shape, (std::vector<int64_t>{p.Hq, v.total_q()})) << w;
  for (int64_t b = 0; b < v.batch(); ++b) {
    const Alone a = alone(p, v, packed, b);
    const std::string ws = w + " sequence " + std::to_string(b) + " (Lq " + std::to_string(a.p.Nq) + ", Lk " +
                           std::to_string(a.p.Nk) + ")";
    if (a.p.Nq == 0 || a.p.Nk == 0) {  // no dense problem to run: the convention of a row that sees no key
      expect_rows_are(got.o, a.q0, a.p.Nq, T(0), ws + " O");
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < a.p.Nq; ++i) ASSERT_EQ(got.lse.data[size_t(h * v.total_q() + a.q0 + i)], -T(kInf)) << ws;
      if (p.backward) {
        expect_rows_are(got.dq, a.q0, a.p.Nq, T(0), ws + " dQ");
        expect_rows_are(got.dk, a.k0, a.p.Nk, T(0), ws + " dK");
        expect_rows_are(got.dv, a.k0, a.p.Nk, T(0), ws + " dV");
      }
      continue;
    }
    const OutputsT<T> ref = dense(a.p, a.in);
    expect_rows_equal(got.o, a.q0, ref.o, ws + " O");
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < a.p.Nq; ++i)
        ASSERT_EQ(got.lse.data[size_t(h * v.total_q() + a.q0 + i)], ref.lse.data[size_t(h * a.p.Nq + i)])
            << ws << " LSE head " << h << " row " << i;
    if (!p.backward) continue;
    expect_rows_equal(got.dq, a.q0, ref.dq, ws + " dQ");
    expect_rows_equal(got.dk, a.k0, ref.dk, ws + " dK");
    expect_rows_equal(got.dv, a.k0, ref.dv, ws + " dV");
  }
}

// ---- step 1 ----------------------------------------------------------------------------------------------

TEST(Step1Varlen, PackedEqualsEachSequenceAloneForwardAndBackward) {
  for (const Batch& bt : kBatches)
    for (const Mods& m : kMods)
      for (bool bwd : {false, true}) {
        const Problem p = make_problem(m, DType::fp32, bwd);
        const Varlen v = varlen_from_lengths(bt.lq, bt.lk);
        const Inputs in = random_packed_inputs(p, v);
        const std::string w = what(bt, m, bwd ? "backward" : "forward");
        // fp64, the oracle: run_packed over step 1's attention.
        auto exact = [](const Problem& sp, const Inputs& si) { return step1::attention<double>(sp, si, sp.backward); };
        expect_equals_each_sequence_alone(p, v, in, run_packed<double>(p, v, in, exact), exact, w + " fp64");
        // float, the stage: its Runner through make_varlen_runner.
        auto runner = make_varlen_runner(step1::stage(), p, v, in, "");
        runner->run();
        if (bwd) runner->run_backward();
        auto as_float = [](const Problem& sp, const Inputs& si) { return step1::attention<float>(sp, si, sp.backward); };
        expect_equals_each_sequence_alone(p, v, in, runner->outputs(), as_float, w + " fp32 runner");
      }
}

// O and LSE from plain fp64 loops over the packed tensors, with the mask flash_attn_varlen_func defines: packed
// query row r of sequence b sees packed key c iff c is one of b's keys and, with i = r - cu_q[b],
// j = c - cu_k[b], j <= i + Lk - Lq (causal), and inside the window around that diagonal.
void packed_loops(const Problem& p, const Varlen& v, const Inputs& in, std::vector<double>& O, std::vector<double>& L) {
  const int64_t Tq = v.total_q(), H = p.Hq, d = p.d;
  O.assign(size_t(Tq * H * d), 0.0);
  L.assign(size_t(H * Tq), -kInf);
  for (int64_t b = 0; b < v.batch(); ++b) {
    const int64_t q0 = v.cu_seqlens_q[size_t(b)], k0 = v.cu_seqlens_k[size_t(b)];
    const int64_t Lq = v.cu_seqlens_q[size_t(b + 1)] - q0, Lk = v.cu_seqlens_k[size_t(b + 1)] - k0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (p.Hq / p.Hkv);
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t diag = i + Lk - Lq;
        std::vector<double> s(size_t(Lk), -kInf);
        double m = -kInf;
        for (int64_t j = 0; j < Lk; ++j) {
          if (p.causal && j > diag) continue;
          if (p.window_left >= 0 && j < diag - p.window_left) continue;
          if (p.window_right >= 0 && j > diag + p.window_right) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += double(in.q.data[size_t(((q0 + i) * H + h) * d + c)]) *
                   double(in.k.data[size_t(((k0 + j) * p.Hkv + hk) * d + c)]);
          double x = double(p.scale) * dot;
          if (p.alibi) x -= double(alibi_slope(h, p.Hq)) * double(std::abs(j - diag));
          if (p.softcap > 0) x = double(p.softcap) * std::tanh(x / double(p.softcap));
          s[size_t(j)] = x;
          m = std::max(m, x);
        }
        if (m == -kInf) continue;  // sees no key: O = 0, LSE = -inf
        double l = 0;
        for (int64_t j = 0; j < Lk; ++j) l += std::exp(s[size_t(j)] - m);
        L[size_t(h * Tq + q0 + i)] = m + std::log(l);
        for (int64_t j = 0; j < Lk; ++j)
          for (int64_t c = 0; c < d; ++c)
            O[size_t(((q0 + i) * H + h) * d + c)] +=
                std::exp(s[size_t(j)] - m) / l * double(in.v.data[size_t(((k0 + j) * p.Hkv + hk) * d + c)]);
      }
    }
  }
}

TEST(Step1Varlen, PackedForwardEqualsPlainLoopsOverThePackedMask) {
  for (const Batch& bt : kBatches)
    for (const Mods& m : kMods) {
      const Problem p = make_problem(m, DType::fp32, false);
      const Varlen v = varlen_from_lengths(bt.lq, bt.lk);
      const Inputs in = random_packed_inputs(p, v);
      const auto got = run_packed<double>(p, v, in, [](const Problem& sp, const Inputs& si) {
        return step1::attention<double>(sp, si, false);
      });
      std::vector<double> O, L;
      packed_loops(p, v, in, O, L);
      const std::string w = what(bt, m);
      for (size_t k = 0; k < L.size(); ++k) {
        if (std::isinf(L[k])) ASSERT_EQ(got.lse.data[k], -kInf) << w << " LSE " << k;
        else ASSERT_NEAR(got.lse.data[k], L[k], 1e-12 * std::max(1.0, std::fabs(L[k]))) << w << " LSE " << k;
      }
      for (size_t k = 0; k < O.size(); ++k) ASSERT_NEAR(got.o.data[k], O[k], 1e-12) << w << " O " << k;
    }
}

// ---- step 2 ----------------------------------------------------------------------------------------------

// Every variant forward, fa1 (q-outer) and fa2 (kv-outer) backward, with tiles that cut every sequence
// (tiles of 3 keys; Br = 2, Bc = 2): equal to step 2 run on each sequence alone, and passing the tolerance
// rule against step 1 run sequence by sequence, in fp32 and bf16.
TEST(Step2Varlen, EveryVariantEqualsEachSequenceAloneAndPassesTheCheck) {
  const step2::Config cfg{3, 40};
  const Stage s = step2::stage(cfg);
  for (const Batch& bt : kBatches)
    for (const Mods& m : kMods)
      for (DType dt : {DType::fp32, DType::bf16})
        for (bool bwd : {false, true}) {
          const Problem p = make_problem(m, dt, bwd);
          const Varlen v = varlen_from_lengths(bt.lq, bt.lk);
          const Inputs in = random_packed_inputs(p, v);
          for (const std::string& variant : s.variants) {
            if (!s.unsupported(p, variant).empty()) continue;  // the backward: fa1 and fa2
            const std::string w = what(bt, m, std::string(dtype_name(dt)) + " " + variant + (bwd ? " backward" : ""));
            auto runner = make_varlen_runner(s, p, v, in, variant);
            runner->run();
            if (bwd) runner->run_backward();
            const Outputs got = runner->outputs();
            auto dense = [&](const Problem& sp, const Inputs& si) {
              auto r = s.make(sp, si, variant);
              r->run();
              if (sp.backward) r->run_backward();
              return r->outputs();
            };
            expect_equals_each_sequence_alone(p, v, in, got, dense, w);
            const CheckReport r = check_against(varlen_oracle(reference_oracle(), v), p, in, got);
            EXPECT_TRUE(r.pass) << w << ": O " << r.stage[0].max_abs << " LSE " << r.stage[1].max_abs << " dQ "
                                << r.stage[2].max_abs << " dK " << r.stage[3].max_abs << " dV " << r.stage[4].max_abs;
          }
        }
}

// The tiles of step 2's tiled loops, sequence by sequence (each sequence's tiles start at its first row and
// key, as a varlen kernel's do): fa2's and fa1's forward and the kv-outer backward visit exactly the
// (query tile, key tile) pairs holding a visible (query, key) pair of the packed mask, counted by brute force,
// on random batches (empty and length-1 sequences among them), masks and block sizes.
void count_visit(const step2::Visit&, void* n) { ++*static_cast<int64_t*>(n); }
void count_fa1_visit(const step2::Fa1Visit&, void* n) { ++*static_cast<int64_t*>(n); }
void count_backward_visit(const step2::BackwardVisit&, void* n) { ++*static_cast<int64_t*>(n); }

TEST(Step2Varlen, TiledLoopsVisitExactlyTheTilesWithAVisiblePair) {
  std::mt19937_64 rng(12);
  int64_t tiles_total = 0, tiles_needed = 0;
  for (uint64_t seed = 0; seed < 150; ++seed) {
    auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
    std::vector<int64_t> lq, lk;
    for (int64_t b = pick(1, 5); b > 0; --b) {
      lq.push_back(pick(0, 4) == 0 ? pick(0, 1) : pick(0, 30));  // often 0 or 1
      lk.push_back(pick(0, 4) == 0 ? pick(0, 1) : pick(0, 30));
    }
    const Varlen v = varlen_from_lengths(lq, lk);
    Problem p;
    p.Hq = p.Hkv = 1, p.d = 4, p.dtype = DType::fp32, p.scale = 0.5f, p.seed = seed, p.backward = true;
    p.causal = pick(0, 1);
    if (pick(0, 1)) p.window_left = pick(-1, 8), p.window_right = pick(-1, 8);
    const step2::Blocks bl{pick(1, 7), pick(1, 7)};
    const Inputs in = random_packed_inputs(p, v);
    // The packed mask, from its definition: rows and keys of one sequence, the diagonal bottom-right.
    auto visible_packed = [&](int64_t r, int64_t c) {
      for (int64_t b = 0; b < v.batch(); ++b) {
        const int64_t q0 = v.cu_seqlens_q[size_t(b)], k0 = v.cu_seqlens_k[size_t(b)];
        const int64_t Lq = v.cu_seqlens_q[size_t(b + 1)] - q0, Lk = v.cu_seqlens_k[size_t(b + 1)] - k0;
        if (r < q0 || r >= q0 + Lq) continue;
        if (c < k0 || c >= k0 + Lk) return false;
        const int64_t diag = (r - q0) + Lk - Lq, j = c - k0;
        return !(p.causal && j > diag) && !(p.window_left >= 0 && j < diag - p.window_left) &&
               !(p.window_right >= 0 && j > diag + p.window_right);
      }
      return false;
    };
    int64_t needed = 0, forward2 = 0, forward1 = 0, backward = 0;
    for (int64_t b = 0; b < v.batch(); ++b) {
      const int64_t q0 = v.cu_seqlens_q[size_t(b)], k0 = v.cu_seqlens_k[size_t(b)];
      for (int64_t i0 = 0; i0 < v.len_q(b); i0 += bl.Br)
        for (int64_t j0 = 0; j0 < v.len_k(b); j0 += bl.Bc) {
          bool any = false;
          for (int64_t i = i0; i < std::min(i0 + bl.Br, v.len_q(b)); ++i)
            for (int64_t j = j0; j < std::min(j0 + bl.Bc, v.len_k(b)); ++j) any = any || visible_packed(q0 + i, k0 + j);
          needed += any;
          ++tiles_total;
        }
      if (!sequence_has_work(v, b)) continue;
      const Problem sp = sequence_problem(p, v, b);
      const Inputs si = sequence_inputs(p, v, in, b);
      Outputs out;
      out.o = Tensor({1, 1, sp.Nq, sp.d});
      out.lse = Tensor({1, 1, sp.Nq});
      step2::attention_fa1(step2::head_of(sp, si, out, 0, 0), bl, count_fa1_visit, &forward1);
      step2::attention_fa2(step2::head_of(sp, si, out, 0, 0), bl, count_visit, &forward2);
      out.dq = Tensor({1, 1, sp.Nq, sp.d});
      out.dk = out.dv = Tensor({1, 1, sp.Nk, sp.d});
      step2::backward_kv_outer({step2::head_of(sp, si, out, 0, 0)}, bl, count_backward_visit, &backward);
    }
    tiles_needed += needed;
    const std::string w = "seed " + std::to_string(seed) + " " + v.describe() + " Br " + std::to_string(bl.Br) +
                          " Bc " + std::to_string(bl.Bc) + " causal " + std::to_string(p.causal) + " window " +
                          std::to_string(p.window_left) + "," + std::to_string(p.window_right);
    EXPECT_EQ(forward2, needed) << "fa2 " << w;
    EXPECT_EQ(forward1, needed) << "fa1 " << w;
    EXPECT_EQ(backward, needed) << "kv-outer " << w;
  }
  EXPECT_LT(tiles_needed, tiles_total) << "the random masks never left a tile out";
}

// ---- refusals --------------------------------------------------------------------------------------------

template <typename F>
void expect_throws_with(const F& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(VarlenRefusals, MalformedDescriptions) {
  expect_throws_with([] { make_varlen({0}, {0}); }, "cu_seqlens_q needs at least 2 entries (batch + 1 offsets, the first 0), got 1");
  expect_throws_with([] { make_varlen({1, 5}, {0, 1}); }, "cu_seqlens_q must start at 0 (got 1)");
  expect_throws_with([] { make_varlen({0, 5}, {2, 4}); }, "cu_seqlens_k must start at 0 (got 2)");
  expect_throws_with([] { make_varlen({0, 5, 3}, {0, 1, 2}); },
                     "cu_seqlens_q must not decrease: entry 2 (3) is below entry 1 (5)");
  expect_throws_with([] { make_varlen({0, 5}, {0, 1, 2}); }, "cu_seqlens_q has 2 entries and cu_seqlens_k 3: both are batch + 1 long");
  expect_throws_with([] { varlen_from_lengths({2, -1}, {1, 1}); }, "lengths_q: a sequence length must be >= 0 (got -1)");
  Varlen v = make_varlen({0, 5, 12}, {0, 7, 20});
  EXPECT_EQ(v.max_seqlen_q, 7);
  EXPECT_EQ(v.max_seqlen_k, 13);
  v.max_seqlen_q = 6;
  expect_throws_with([&] { v.validate(); }, "sequence 1 has 7 queries: max_seqlen_q (6) must be at least the longest sequence");
  v.max_seqlen_q = 100;  // longer than every sequence: allowed (a kernel's grid is only larger)
  v.validate();
  for (const char* text : {"", "0,x", "0,,5", "0,-5", "0,5,", "3000000000", " 0,5"})
    expect_throws_with([&] { parse_cu_seqlens(text, "--cu-seqlens-q"); },
                       "--cu-seqlens-q: expected offsets separated by commas, whole numbers from 0 to 2147483647");
  EXPECT_EQ(parse_cu_seqlens("0,5,5,12", "x"), (std::vector<int32_t>{0, 5, 5, 12}));
}

TEST(VarlenRefusals, WhatAPackedBatchDoesNotTake) {
  const Varlen v = varlen_from_lengths({3, 2}, {4, 2});
  Problem p;
  p.Hq = p.Hkv = 2, p.d = 8;
  Problem q = p;
  q.bias = true;
  expect_throws_with([&] { validate_varlen_problem(q, v); },
                     "a bias is a dense [B, Hq, Nq, Nk] tensor, which a packed batch of ragged sequences has no shape for");
  q = p, q.dropout = 0.1f;
  expect_throws_with([&] { validate_varlen_problem(q, v); }, "varlen takes no dropout yet");
  q = p, q.splits = 2;
  expect_throws_with([&] { validate_varlen_problem(q, v); }, "varlen takes no split-KV");
  q = p, q.Hq = 3;
  expect_throws_with([&] { validate_varlen_problem(q, v); }, "heads (3) must be a multiple of kv-heads (2)");
  // Packed inputs whose rows do not match the lists.
  Inputs in = random_packed_inputs(p, v);
  in.q = Tensor({4, 2, 8});
  expect_throws_with([&] { check_packed_inputs(p, v, in); },
                     "q has shape [4, 2, 8]; cu_seqlens_q ends at 5 and the problem has 2 query heads of dim 8: expected [5, 2, 8]");
  in = random_packed_inputs(p, v);
  in.v = Tensor({6, 1, 8});
  expect_throws_with([&] { check_packed_inputs(p, v, in); }, "v has shape [6, 1, 8]; cu_seqlens_k ends at 6");
  // A stage without a varlen path.
  Stage s = step1::stage();
  s.has_varlen = false;
  expect_throws_with([&] { make_varlen_runner(s, p, v, random_packed_inputs(p, v), ""); },
                     "step1_cpu_reference has no varlen path (--cu-seqlens-q, --cu-seqlens-k): steps 1, 2, 4, 5 and 7 have");
}

// ---- the command line ------------------------------------------------------------------------------------

using cli_test::run_main, cli_test::run_stage_main;

void expect_refused(const cli_test::CliResult& r, const std::string& message, const std::string& w) {
  EXPECT_EQ(r.rc, 2) << w << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << w << "\nstderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << w << "\nstderr: " << r.err;
  EXPECT_EQ(r.out, "") << w;
}

TEST(VarlenCli, Step1ChecksAPackedBatchForwardAndBackward) {
  const cli_test::CliResult r = run_stage_main(
      "step1_cpu_reference", {"--cu-seqlens-q", "0,5,5,12,15", "--cu-seqlens-k", "0,7,7,20,20", "--heads", "4",
                              "--kv-heads", "2", "--dim", "16", "--causal", "--window", "4,-1", "--softcap", "8",
                              "--alibi", "--backward", "--check"});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("varlen batch=4 cu_seqlens_q=0,5,5,12,15 cu_seqlens_k=0,7,7,20,20 max_seqlen_q=7 max_seqlen_k=13 "
                       "Hq=4 Hkv=2 d=16 bf16 causal (bottom-right per sequence)"),
            std::string::npos)
      << r.out;
  size_t passes = 0;
  for (size_t at = r.out.find("  pass\n"); at != std::string::npos; at = r.out.find("  pass\n", at + 1)) ++passes;
  EXPECT_EQ(passes, 5u) << r.out;  // O, LSE, dQ, dK, dV
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(VarlenCli, HelpNamesTheFlags) {
  const cli_test::CliResult r = run_stage_main("step1_cpu_reference", {"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--cu-seqlens-q"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--cu-seqlens-k"), std::string::npos) << r.out;
}

TEST(VarlenCli, BadInputIsRefusedWithOneLine) {
  const std::vector<std::string> ok = {"--cu-seqlens-q", "0,5,5,12", "--cu-seqlens-k", "0,7,7,20"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = ok;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--cu-seqlens-q", "0,5"}, "a packed batch needs both --cu-seqlens-q and --cu-seqlens-k"},
      {{"--cu-seqlens-q", "0,5,3", "--cu-seqlens-k", "0,1,2"}, "cu_seqlens_q must not decrease: entry 2 (3) is below entry 1 (5)"},
      {{"--cu-seqlens-q", "1,5", "--cu-seqlens-k", "0,1"}, "cu_seqlens_q must start at 0 (got 1)"},
      {{"--cu-seqlens-q", "0,5", "--cu-seqlens-k", "0,1,2"}, "cu_seqlens_q has 2 entries and cu_seqlens_k 3"},
      {{"--cu-seqlens-q", "0,5;6", "--cu-seqlens-k", "0,1"}, "--cu-seqlens-q: expected offsets separated by commas"},
      {with({"--seq", "4"}), "does not take --batch, --seq, --seq-q and --seq-k: the lengths come from the lists"},
      {with({"--causal", "--input-pos", "2"}), "does not take --input-pos: causal is bottom-right in each sequence"},
      {with({"--bias", "b.npy"}), "does not take --bias: a dense [B, Hq, Nq, Nk] bias has no shape for ragged sequences"},
      {with({"--dropout", "0.1"}), "does not take --dropout"},
      {with({"--heads", "3", "--kv-heads", "2"}), "heads (3) must be a multiple of kv-heads (2)"},
  };
  for (const auto& [args, message] : cases) {
    std::string w;
    for (const std::string& a : args) w += a + " ";
    expect_refused(run_stage_main("step1_cpu_reference", args), message, w);
  }
  Stage s = step1::stage();
  s.has_varlen = false;
  expect_refused(run_main(s, ok), "step1_cpu_reference has no varlen path (--cu-seqlens-q, --cu-seqlens-k): steps 1, 2, 4, 5 and 7 have",
                 "a stage without varlen");
}

}  // namespace
}  // namespace fa
