// FlashAttention, step by step — core/online_softmax.h
// The online-softmax state of one query row, taught in step 2 and reused by the kernels of steps 3 to 5.
//
// After seeing keys 1..j, a row keeps
//   m = max_{k<=j} s_k                  (running max)
//   l = sum_{k<=j} exp(s_k - m)         (running denominator, relative to m)
//   acc = sum_{k<=j} exp(s_k - m) v_k   (running, un-normalised output, relative to m)
// Invariant: O_j = acc / l is the attention output over the first j keys, and LSE_j = m + log(l).
// A new score s (or a new tile's max) rescales the old terms by alpha = exp(m_old - m_new): the
// "online" correction of Milakov & Gimelshein (2018), eq. (3)-(4) of FlashAttention-2.
//
// Masked scores are -inf. A row that has seen only -inf keeps m = -inf, l = 0, and its output is 0
// with LSE = -inf; the guards below keep exp(-inf - (-inf)) = NaN out of it.
#pragma once
#include <cmath>

#include "core/hd.h"

namespace fa {

// exp(a - b) with the convention exp(-inf - -inf) = 0 ... used for rescale factors:
// when the new max is still -inf nothing has been accumulated, so any factor works; we pick 0.
FA_HD float safe_exp_diff(float a, float b) { return b == -INFINITY ? 0.0f : expf(a - b); }

// The scalar part of the state; the accumulator vector lives beside it (a register array on the GPU).
struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.0f;
};

// Takes the max `m_tile` of a new tile of scores; returns alpha, the factor by which l and acc
// must be multiplied before the tile's exp(s - m_new) terms are added. Updates m (not l).
FA_HD float online_rescale(SoftmaxState& st, float m_tile) {
  const float m_new = fmaxf(st.m, m_tile);
  const float alpha = safe_exp_diff(st.m, m_new);
  st.m = m_new;
  st.l *= alpha;
  return alpha;
}

// Final normalisation: 1 / l, or 0 for a fully masked row (so O = 0, not NaN).
FA_HD float inv_l(const SoftmaxState& st) { return st.l > 0.0f ? 1.0f / st.l : 0.0f; }

// Log-sum-exp of the row's scores (natural log); -inf for a fully masked row.
FA_HD float row_lse(const SoftmaxState& st) { return st.l > 0.0f ? st.m + logf(st.l) : -INFINITY; }

// The merge of two partial states over disjoint key sets: (m1,l1,acc1) (+) (m2,l2,acc2).
// It is associative and commutative, and the empty state (-inf, 0, 0) is its identity: the reason
// split-KV ("flash-decoding") may process key ranges in parallel and combine them in any order.
// Returns the two scale factors to apply to acc1 and acc2; acc = c1 * acc1 + c2 * acc2.
struct MergeFactors {
  float c1, c2;
};
FA_HD MergeFactors merge_states(SoftmaxState& s1, const SoftmaxState& s2) {
  const float m = fmaxf(s1.m, s2.m);
  const float c1 = safe_exp_diff(s1.m, m), c2 = safe_exp_diff(s2.m, m);
  s1.l = c1 * s1.l + c2 * s2.l;
  s1.m = m;
  return {c1, c2};
}

// The vector half of the merge: acc1 = c1 * acc1 + c2 * acc2 over n values, with the factors that
// merge_states returned. With the empty state on either side the result is the other side, exactly.
FA_HD void merge_acc(float* acc1, const float* acc2, int n, MergeFactors c) {
  for (int k = 0; k < n; ++k) acc1[k] = c.c1 * acc1[k] + c.c2 * acc2[k];
}

// The state of a finished partial result stored as (LSE, O), O already divided by its own l: (m, l, acc) =
// (LSE, 1, O), or the empty state (-inf, 0, 0) for a part that saw no key. Split-KV (step 4f, combine.cuh)
// stores each split so and merges these states: the merge of all splits is the state over all keys.
FA_HD SoftmaxState partial_state(float lse) { return SoftmaxState{lse, lse == -INFINITY ? 0.0f : 1.0f}; }

}  // namespace fa
