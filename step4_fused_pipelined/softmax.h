// FlashAttention, step by step — step 4: the online softmax on mma fragments (step4_fused_pipelined/softmax.h)
//
// The update of core/online_softmax.h, for the two rows (g and g + 8) a thread holds in the S
// accumulators, with two changes that matter on the GPU:
//  - exp2 instead of exp, with the scale and log2(e) folded into one multiply-add:
//      exp(scale * (s - m)) = exp2(s * scale_log2 - m * scale_log2)        (one FFMA + one MUFU.EX2)
//    The running max m is kept in raw score units (this needs scale > 0: the max commutes with scaling).
//  - l is kept as this thread's partial sum over its own columns. alpha is the same for the four threads
//    of a row (a quad), so the partial sums can be rescaled independently and added once at the end:
//    two shuffles per row per kernel instead of two per tile.
// The row's max and sum are each kept in two partial values (even and odd n8 blocks), merged at the end: a
// single running value makes every fmax and every add wait for the one before (a chain of kSTiles and
// 2 kSTiles dependent instructions per row), and a warp has few neighbours to hide that latency behind.
#pragma once
#include <cmath>

#include "gpu/ptx.h"

namespace fa::step4 {

template <int kSTiles, int kOTiles>
struct RowSoftmax {
  float m[2] = {-INFINITY, -INFINITY};  // running max of the raw scores of rows g, g + 8
  float l[2] = {0.0f, 0.0f};            // this thread's share of the running denominators

  // s: [kSTiles][4] scores of the new tile -> probabilities exp(scale * (s - m_new)), unnormalised.
  // o: [kOTiles][4] output accumulators, rescaled by alpha = exp(scale * (m_old - m_new)).
  __device__ __forceinline__ void update(float (&s)[kSTiles][4], float (&o)[kOTiles][4], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) rescale_row(o, r, update_row(s, r, scale_log2));
  }
  // Row r (0: g, 1: g + 8) of the update: its new max, P in place of its scores, l; returns its alpha.
  __device__ __forceinline__ float update_row(float (&s)[kSTiles][4], int r, float scale_log2) {
    float part[2] = {m[r], -INFINITY};  // two independent chains (see the top of the file)
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) part[nt % 2] = fmaxf(part[nt % 2], fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    float mx = fmaxf(part[0], part[1]);
    // The row's four threads (a quad: lanes 4g .. 4g+3) hold disjoint columns: combine them.
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with every score masked so far keeps m = -inf; use 0 so that exp2(-inf - 0) = 0, not NaN.
    const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
    const float alpha = ptx::exp2_approx(m[r] * scale_log2 - m_scaled);
    m[r] = mx;
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = ptx::exp2_approx(fmaf(s[nt][2 * r + e], scale_log2, -m_scaled));
        s[nt][2 * r + e] = p;
        sum[nt % 2] += p;
      }
    l[r] = l[r] * alpha + (sum[0] + sum[1]);
    return alpha;
  }
  __device__ __forceinline__ void rescale_row(float (&o)[kOTiles][4], int r, float alpha) {
#pragma unroll
    for (int nd = 0; nd < kOTiles; ++nd) {
      o[nd][2 * r] *= alpha;
      o[nd][2 * r + 1] *= alpha;
    }
  }

  // After the last tile: the full l of each row (summed over the quad), 1/l (0 for a row that saw no
  // key, so O = 0) and the natural-log LSE = scale * m + ln(l) (-inf for such a row).
  __device__ __forceinline__ void finish(float (&inv_l)[2], float (&lse)[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv_l[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      lse[r] = sum > 0.0f ? (m[r] * scale_log2 + log2f(sum)) * 0.69314718055994531f : -INFINITY;
    }
  }
};

}  // namespace fa::step4
