// FlashAttention, step by step — step 2: 3-pass, 2-pass and online softmax attention (step2_online_softmax/passes.cpp)
//
// Three ways to compute one head's softmax(S) V, from three passes over a stored row of scores down to one
// pass with a running state, then the merge of running states (split-KV). See online.h and README.md.
#include <algorithm>

#include "tiles.h"

namespace fa::step2 {

// 3-pass safe softmax, as step 1: the whole score matrix is stored, and each row is read three times.
void attention_3pass(const Head& hd) {
  const int64_t Nq = hd.Nq, Nk = hd.Nk;
  MatR P = scores(hd, 0, Nq, 0, Nk);  // [Nq, Nk]  S, overwritten by P in place
  for (int64_t i = 0; i < Nq; ++i) {
    float* row = &P(i, 0);
    SoftmaxState st;
    for (int64_t j = 0; j < Nk; ++j) st.m = std::max(st.m, row[j]);                // pass 1: m_i = max_j S_ij
    for (int64_t j = 0; j < Nk; ++j) st.l += (row[j] = safe_exp_diff(row[j], st.m));  // pass 2: l_i = sum_j exp(S_ij - m_i)
    const float inv = inv_l(st);
    for (int64_t j = 0; j < Nk; ++j) row[j] *= inv;                                  // pass 3: P_ij = exp(S_ij - m_i) / l_i
    hd.lse[i] = row_lse(st);
  }
  apply_dropout(hd, P, 0, 0);
  Map(hd.o, Nq, hd.d) = P * v_rows(hd, 0, Nk);  // [Nq, d]
}

// 2-pass: K split into T tiles, Q and V untiled. Pass 1 treats every tile on its own (on a GPU, tiles in
// parallel); the global max is the one barrier; pass 2 corrects each tile's numerators by
// PRM = exp(LM - GM) and normalises. The corrected A is then an ordinary [Nq, Nk] matrix: O = A V.
void attention_2pass(const Head& hd, int64_t tile) {
  const int64_t Nq = hd.Nq, Nk = hd.Nk, T = ceil_div(Nk, tile);
  MatR E(Nq, Nk);            // [Nq, Nk]  local numerators exp(S - LM), later A
  MatR LM(Nq, T), LS(Nq, T); // [Nq, T]   local max and local sum of each (row, tile)

  // Pass 1: per tile, the scores, the local max, the local numerators and the local sum.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t j0 = t * tile, cols = std::min(tile, Nk - j0);
    const MatR S = scores(hd, 0, Nq, j0, cols);  // [Nq, cols]
    for (int64_t i = 0; i < Nq; ++i) {
      LM(i, t) = S.row(i).maxCoeff();
      float ls = 0.0f;
      for (int64_t c = 0; c < cols; ++c) ls += (E(i, j0 + c) = safe_exp_diff(S(i, c), LM(i, t)));
      LS(i, t) = ls;
    }
  }

  // The barrier: GM = max over tiles of LM needs every tile of pass 1.
  const Eigen::VectorXf GM = LM.rowwise().maxCoeff();  // [Nq]

  // Pass 2: PRM = exp(LM - GM) brings every tile to the global max; L = sum_t PRM_t LS_t.
  MatR PRM(Nq, T);  // [Nq, T]
  for (int64_t i = 0; i < Nq; ++i) {
    SoftmaxState st{GM(i), 0.0f};
    for (int64_t t = 0; t < T; ++t) st.l += (PRM(i, t) = safe_exp_diff(LM(i, t), GM(i))) * LS(i, t);
    const float inv = inv_l(st);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t j0 = t * tile, cols = std::min(tile, Nk - j0);
      E.block(i, j0, 1, cols) *= PRM(i, t) * inv;  // A_ij = exp(S_ij - LM_t) PRM_t / L
    }
    hd.lse[i] = row_lse(st);
  }

  // Un-tiled, A is one matrix, and A V one ordinary product over all keys: V was never tiled.
  apply_dropout(hd, E, 0, 0);
  Map(hd.o, Nq, hd.d) = E * v_rows(hd, 0, Nk);  // [Nq, d]
}

// The online pass over keys [j0, j1) of row i: per tile, m_new = max(m, max_j s_j), rescale l and acc by
// alpha = exp(m - m_new), add the tile's exp(s_j - m_new) terms. Only a tile of scores is ever stored.
Partial online_partial(const Head& hd, int64_t i, int64_t j0, int64_t j1, int64_t tile) {
  Partial part;
  part.acc.assign(size_t(hd.d), 0.0f);
  Eigen::Map<Eigen::RowVectorXf> acc(part.acc.data(), hd.d);  // [d]
  for (int64_t t0 = j0; t0 < j1; t0 += tile) {
    const int64_t cols = std::min(tile, j1 - t0);
    if (block_masked(hd, i, 1, t0, cols)) continue;  // causal or window: no key of this tile is visible
    MatR p = scores(hd, i, 1, t0, cols);    // [1, cols]  s_j, then exp(s_j - m_new) in place
    acc *= online_rescale(part.st, p.maxCoeff());
    for (int64_t c = 0; c < cols; ++c) part.st.l += (p(0, c) = safe_exp_diff(p(0, c), part.st.m));
    apply_dropout(hd, p, i, t0);
    acc += p * v_rows(hd, t0, cols);  // [1, d]
  }
  return part;
}

void attention_online(const Head& hd, int64_t tile) {
  for (int64_t i = 0; i < hd.Nq; ++i) {
    const Partial part = online_partial(hd, i, 0, hd.Nk, tile);
    finish_row(hd, i, part.st, part.acc.data());
  }
}

void merge(Partial& a, const Partial& b) {
  const MergeFactors c = merge_states(a.st, b.st);
  merge_acc(a.acc.data(), b.acc.data(), int(a.acc.size()), c);
}

// Split-KV: on a GPU each key range is its own thread block, which is how one query row (decoding) can
// keep a whole GPU busy. A second step combines the partial states; here, as a tree of merges.
void attention_split_kv(const Head& hd, int64_t splits, int64_t tile) {
  const int64_t len = ceil_div(hd.Nk, splits);
  for (int64_t i = 0; i < hd.Nq; ++i) {
    std::vector<Partial> parts;  // [splits]
    for (int64_t s = 0; s < splits; ++s)
      parts.push_back(online_partial(hd, i, std::min(s * len, hd.Nk), std::min((s + 1) * len, hd.Nk), tile));
    for (size_t stride = 1; stride < parts.size(); stride *= 2)
      for (size_t k = 0; k + stride < parts.size(); k += 2 * stride) merge(parts[k], parts[k + stride]);
    finish_row(hd, i, parts[0].st, parts[0].acc.data());
  }
}

}  // namespace fa::step2
