// FlashAttention, step by step — step 2: the block operations every variant shares (step2_online_softmax/tiles.h)
//
// A block of scores S = scale Q_rows K_cols^T with the mask applied, a block of V, and dropout on a block of
// weights. Eigen does the two matrix products; the softmax arithmetic stays in plain loops in the variants,
// where a learner can read it.
#pragma once
#include <Eigen/Dense>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/problem.h"
#include "core/score_mod.h"
#include "online.h"

namespace fa::step2 {

using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const MatR>;
using Map = Eigen::Map<MatR>;

// Rows [i0, i0 + rows) of Q, or keys [j0, j0 + cols) of K or V, as matrices.   [rows, d]
inline ConstMap q_rows(const Head& hd, int64_t i0, int64_t rows) { return ConstMap(hd.q + i0 * hd.d, rows, hd.d); }
inline ConstMap k_rows(const Head& hd, int64_t j0, int64_t cols) { return ConstMap(hd.k + j0 * hd.d, cols, hd.d); }
inline ConstMap v_rows(const Head& hd, int64_t j0, int64_t cols) { return ConstMap(hd.v + j0 * hd.d, cols, hd.d); }

// S_ij for query rows [i0, i0 + rows) and keys [j0, j0 + cols): scale Q_i K_j^T, then the score
// modifiers (bias, ALiBi, softcap: core/score_mod.h's modify()), then the mask (causal and window:
// visible()); masked entries -inf. The one place every variant and the backward get their scores from.
inline MatR scores(const Head& hd, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  MatR S = hd.scale * (q_rows(hd, i0, rows) * k_rows(hd, j0, cols).transpose());  // [rows, cols]
  const bool window = hd.mod.window_left >= 0 || hd.mod.window_right >= 0;
  if (hd.mod.causal || window || hd.modifies)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = i0 + r, j = j0 + c;
        if (!visible(hd.mod, i, j)) S(r, c) = -INFINITY;
        else if (hd.modifies) S(r, c) = modify<float>(hd.mod, S(r, c), hd.bias ? hd.bias[i * hd.Nk + j] : 0.0f, hd.h, i, j);
      }
  return S;
}

// Does the block (rows [i0, i0 + rows), keys [j0, j0 + cols)) lie wholly outside every row's visible
// range: above the causal diagonal, or right or left of a sliding window? Such blocks contribute
// exp(-inf) = 0 and are skipped, as every FlashAttention kernel does. The visible range of a row
// (core/score_mod.h: visible_range) only moves right as the row grows, so the first row's lower end and
// the last row's upper end bound the block's.
inline bool block_masked(const Head& hd, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  int64_t lo_first, hi_first, lo_last, hi_last;
  visible_range(hd.mod, hd.Nk, i0, &lo_first, &hi_first);
  visible_range(hd.mod, hd.Nk, i0 + rows - 1, &lo_last, &hi_last);
  return j0 > hi_last || j0 + cols - 1 < lo_first;
}

// P *= Z / (1 - p) element-wise, for the block at (i0, j0). A no-op without dropout.   P: [rows, cols]
template <typename M>
void apply_dropout(const Head& hd, M& P, int64_t i0, int64_t j0) {
  if (hd.drop.threshold == 0) return;
  for (int64_t r = 0; r < P.rows(); ++r)
    for (int64_t c = 0; c < P.cols(); ++c) P(r, c) *= hd.keep(i0 + r, j0 + c);
}

// The one normalisation at the end of a row: O_i = acc_i / l_i, LSE_i = m_i + log l_i
// (O_i = 0 and LSE_i = -inf for a row that saw no key).   acc: [d]
inline void finish_row(const Head& hd, int64_t i, const SoftmaxState& st, const float* acc) {
  const float inv = inv_l(st);
  for (int64_t c = 0; c < hd.d; ++c) hd.o[i * hd.d + c] = acc[c] * inv;
  hd.lse[i] = row_lse(st);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// printf into a std::string: the tables and the trace are built as text, then printed at once.
template <typename... A>
void out(std::string& s, const char* fmt, A... a) {
  if constexpr (sizeof...(A) == 0) {
    s += fmt;  // a plain string: no format to apply
  } else {
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, a...);
    s += buf;
  }
}

}  // namespace fa::step2
