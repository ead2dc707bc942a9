// FlashAttention, step by step — step 4: the mask as a policy (step4_fused_pipelined/mask.h)
//
// What it adds: one type that says which keys each query row sees, in the three forms a kernel needs (as
// FlashAttention 3's hopper/mask.h and cutlass' fmha_fusion.hpp do):
//   the trip count   key_tiles(rows): which K/V tiles a block of query rows visits; query_tiles(keys): which
//                    query tiles see a block of keys (the backward's transposed loop);
//   the tile test    needs(span, k0, cols): does a tile cross an edge of the mask, so that it pays for the
//                    per-element test? Every other tile passes untouched;
//   the element      row(b, h, i): what a thread keeps of query row i; visible(row, j) and operator()(s, row, j):
//                    the score, or -inf where the row does not see key j; apply_mask() runs it over a thread's
//                    S accumulators.
// CausalMask is the mask of the plain kernels: the causal rule (core/problem.h, sees, aligned bottom-right by
// input_pos) and the end of K (a tile's keys past it are zero-filled by TMA). Rows past the end of Q: the
// forward never stores them, so its tile test and operator() ignore them; the backward gives them LSE = +inf,
// so that their P = exp2(s - inf) is 0 in every tile (step 5's device.cuh), and its element test visible()
// says what an element (i, j) is: a row of Q that sees a key of K. Step 4e's
// ScoreMods (score_mod.cuh) is the same interface with the sliding window and the value modifiers, so a kernel
// written against it runs either; adding a mask kind is a new type with these members.
// FA_HD (host and device): the host tests (tests/test_host_kernels.cpp) check it against brute force.
// The S accumulators of mma.sync: a thread of the warp holds, for each n8 tile nt of S, four scores
// (mma C fragment, gpu/ptx.h):
//   s[nt][0..1] = row g,     keys nt*8 + 2t, +1          (g = lane / 4, t = lane % 4)
//   s[nt][2..3] = row g + 8, keys nt*8 + 2t, +1
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/problem.h"
#include "core/tile_range.h"
#include "gpu/attn_params.h"

namespace fa::step4 {

// The causal mask's tile test: does a key of [k0, k0 + cols) lie past the end of K, or above diagonal `diag`?
FA_HD bool causal_cuts(const AttnParams& p, int64_t diag, int k0, int cols) {
  return k0 + cols > p.Nk || (p.causal && k0 + cols - 1 > diag);
}

struct CausalMask {
  static constexpr bool kChangesValues = false;  // a tile the mask does not cross passes untouched
  const AttnParams& p;  // its shapes, causal and input_pos, read where used (a kernel's parameters)

  FA_HD explicit CausalMask(const AttnParams& params) : p(params) {}

  // ---- the trip count (core/tile_range.h: every visible pair is in a visited tile) ----
  FA_HD TileRange key_tiles(int first_row, int last_row, int Bc) const {
    return fa::key_tiles(p.causal, p.input_pos, p.Nk, first_row, last_row, Bc);
  }
  FA_HD TileRange query_tiles(int k0, int Bc, int Bq) const {
    return fa::query_tiles(p.causal, p.input_pos, p.Nq, p.Nk, k0, Bc, Bq);
  }

  // ---- the tile test: rows first .. last (a warp's, or a tile's) against keys [k0, k0 + cols) ----
  struct Span {
    int64_t diag;  // the first row's diagonal, input_pos + first: later rows see more
  };
  FA_HD Span span(int first, int /*last*/) const { return {p.input_pos + first}; }
  // True when some element is hidden: a key past the end of K, or a key above the first row's diagonal.
  FA_HD bool needs(const Span& r, int k0, int cols) const {
    return causal_cuts(p, r.diag, k0, cols);
  }

  // ---- the element: what a row keeps (here its index i), and the test of key j (the forward's operator()
  // writes -inf over a hidden score; the backward's visible() selects P = 0, for rows of Q only) ----
  using Row = int;
  FA_HD Row row(int /*b*/, int /*h*/, int i) const { return i; }
  FA_HD bool visible(Row i, int j) const { return i < p.Nq && j < p.Nk && sees(p.causal, p.input_pos, i, j); }
  FA_HD float operator()(float s, Row i, int j) const {
    if (j >= p.Nk || !sees(p.causal, p.input_pos, i, j)) s = -INFINITY;
    return s;
  }
};

// The forward's S accumulators through a mask (any mask type: operator() and a Row): row r0 (r8) is this
// thread's row g (g + 8), key_2t the key of its column 2t in n-tile 0; hidden scores become -inf.
template <int NT, class Mask>
FA_HD void apply_mask(const Mask& mask, float (&s)[NT][4], const typename Mask::Row& r0, const typename Mask::Row& r8,
                      int key_2t) {
FA_UNROLL
  for (int nt = 0; nt < NT; ++nt)
FA_UNROLL
    for (int e = 0; e < 4; ++e) s[nt][e] = mask(s[nt][e], e < 2 ? r0 : r8, key_2t + nt * 8 + (e & 1));
}

}  // namespace fa::step4
