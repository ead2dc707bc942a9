// FlashAttention, step by step — step 2: tiled FlashAttention on the CPU, both loop orders (step2_online_softmax/flash.cpp)
//
// The online softmax of passes.cpp, done a block of Br query rows at a time, so that each K_j, V_j block
// is used by Br rows: two small matrix products per visit, S_ij = scale Q_i K_j^T and P_ij V_j.
// What changes between FlashAttention-1 and FlashAttention-2 is only which loop is outside, and so where
// the running state (O_i, l_i, m_i) lives between two visits of the same Q block:
//
//   fa1: for j (K/V blocks) { for i (Q blocks) { read O_i, l_i, m_i from HBM; update; write them back } }
//        Dao et al. 2022, Algorithm 1, lines 5-15. O_i is stored normalised after every visit (line 12).
//   fa2: for i (Q blocks) { state on chip; for j (K/V blocks) { update } ; O_i = acc / l_i once }
//        Dao 2023, Algorithm 1. No HBM traffic for the state, one division per row instead of one per visit,
//        and the Q blocks are independent: one thread block each on a GPU (step 3 onwards).
// Blocks that lie wholly outside the mask (above the causal diagonal, or outside a sliding window) are
// skipped in both.
#include <algorithm>

#include "tiles.h"

namespace fa::step2 {

Blocks blocks_from_budget(int64_t M, int64_t d) {
  // K_j, V_j, Q_i, O_i: four blocks of d columns share the M floats; Br <= d bounds the S_ij block.
  const int64_t Bc = ceil_div(M, 4 * d);
  return {std::min(Bc, d), Bc};
}

void attention_fa1(const Head& hd, Blocks bl, Fa1VisitObserver observe, void* ctx) {
  const int64_t Nq = hd.Nq, Nk = hd.Nk, d = hd.d;
  // "HBM": O, l, m between visits, initialised as Algorithm 1, line 2: O = 0, l = 0, m = -inf.
  Map O(hd.o, Nq, d);  // [Nq, d]  normalised after each visit
  O.setZero();
  std::vector<SoftmaxState> ml(Nq);  // [Nq]  (m_i, l_i) of every row
  std::vector<SoftmaxState> tile(bl.Br);  // [Br]  (m~_ij, l~_ij) of the block being visited

  for (int64_t j0 = 0; j0 < Nk; j0 += bl.Bc) {  // outer: K_j, V_j loaded once
    const int64_t cols = std::min(bl.Bc, Nk - j0);
    for (int64_t i0 = 0; i0 < Nq; i0 += bl.Br) {  // inner: every Q block visits K_j, V_j
      const int64_t rows = std::min(bl.Br, Nq - i0);
      if (block_masked(hd, i0, rows, j0, cols)) continue;
      const MatR S = scores(hd, i0, rows, j0, cols);  // [rows, cols]  S_ij
      MatR P(rows, cols);                             // [rows, cols]  P~_ij = exp(S_ij - m~_ij)
      for (int64_t r = 0; r < rows; ++r) {
        tile[r] = {S.row(r).maxCoeff(), 0.0f};  // m~_ij = rowmax(S_ij), l~_ij = rowsum(P~_ij)
        for (int64_t c = 0; c < cols; ++c) tile[r].l += (P(r, c) = safe_exp_diff(S(r, c), tile[r].m));
      }
      MatR Pd = P;  // [rows, cols]  dropout after l~_ij is summed: l stays that of the undropped weights
      apply_dropout(hd, Pd, i0, j0);
      const MatR PV = Pd * v_rows(hd, j0, cols);  // [rows, d]  P~_ij Z_ij / (1 - p) V_j
      for (int64_t r = 0; r < rows; ++r) {
        SoftmaxState& st = ml[size_t(i0 + r)];
        const float l_old = st.l;
        // m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij: the merge.
        const MergeFactors c = merge_states(st, tile[r]);
        // Line 12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j),
        // with the dropped P~_ij Z_ij / (1 - p) in place of P~_ij when there is dropout.
        O.row(i0 + r) = (c.c1 * l_old * O.row(i0 + r) + c.c2 * PV.row(r)) * inv_l(st);
      }
      if (observe)
        observe({i0, rows, j0, cols, S.data(), P.data(), Pd.data(), tile.data(), &ml[size_t(i0)], &O(i0, 0)}, ctx);
    }
  }
  for (int64_t i = 0; i < Nq; ++i) hd.lse[i] = row_lse(ml[size_t(i)]);
}

void attention_fa2(const Head& hd, Blocks bl, VisitObserver observe, void* ctx) {
  const int64_t Nq = hd.Nq, Nk = hd.Nk, d = hd.d;
  for (int64_t i0 = 0; i0 < Nq; i0 += bl.Br) {  // outer: one Q block, independent of the others
    const int64_t rows = std::min(bl.Br, Nq - i0);
    // "On chip" for the whole inner loop.
    MatR acc = MatR::Zero(rows, d);              // [rows, d]  O_i, un-normalised
    std::vector<SoftmaxState> st(rows);  // [rows]     (m_i, l_i)
    std::vector<float> m_old(rows);      // [rows]     m_i before the visit (for the trace)

    for (int64_t j0 = 0; j0 < Nk; j0 += bl.Bc) {  // inner: the K/V blocks, in order
      const int64_t cols = std::min(bl.Bc, Nk - j0);
      if (block_masked(hd, i0, rows, j0, cols)) continue;  // causal or window: no row sees K_j
      const MatR S = scores(hd, i0, rows, j0, cols);  // [rows, cols]
      MatR P(rows, cols);                             // [rows, cols]
      for (int64_t r = 0; r < rows; ++r) {
        m_old[r] = st[r].m;
        // m_i = max(m_i, rowmax(S_ij)); l_i and O_i rescaled by alpha = exp(m_old - m_i).
        acc.row(r) *= online_rescale(st[r], S.row(r).maxCoeff());
        for (int64_t c = 0; c < cols; ++c) st[r].l += (P(r, c) = safe_exp_diff(S(r, c), st[r].m));
      }
      apply_dropout(hd, P, i0, j0);
      acc.noalias() += P * v_rows(hd, j0, cols);  // O_i += P_ij V_j
      if (observe) observe({i0, rows, j0, cols, S.data(), P.data(), m_old.data(), st.data(), acc.data()}, ctx);
    }
    for (int64_t r = 0; r < rows; ++r) finish_row(hd, i0 + r, st[r], &acc(r, 0));  // O_i = acc / l_i, once
  }
}

}  // namespace fa::step2
