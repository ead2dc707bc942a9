// FlashAttention, step by step — step 4: masking scores in registers (step4_fused_pipelined/mask.h)
//
// The causal mask (core/problem.h, sees) and the end of K act on the S accumulators of mma.sync. A thread
// of the warp holds, for each n8 tile nt of S, four scores (mma C fragment, gpu/ptx.h):
//   s[nt][0..1] = row g,     keys nt*8 + 2t, +1          (g = lane / 4, t = lane % 4)
//   s[nt][2..3] = row g + 8, keys nt*8 + 2t, +1
// Only tiles that cross the diagonal or an end pay for the per-element test (the *_need_mask predicates);
// all others skip this code entirely. Step 5's kernels use tile_needs_mask and FA_VISIBLE.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/problem.h"
#include "gpu/attn_params.h"

namespace fa::step4 {

// The backward's test of element (i, j): query row i exists (rows past the end of Q are zero-filled tiles
// whose products must add nothing) and sees key j. A macro, not a function: written as a function, the
// same test changes how the compiler lays out the backward kernels, and they run slower
// (docs/results/structure.md).
#define FA_VISIBLE(p, i, j) ((i) < (p).Nq && (j) < (p).Nk && ::fa::sees((p).causal, (p).input_pos, (i), (j)))

// True when a key of [k0, k0 + cols) is masked for the rows from one whose diagonal is key `diag` on
// (diag = input_pos + that row): past the end of K, or above that diagonal (later rows see more).
__device__ __forceinline__ bool keys_need_mask(const AttnParams& p, int64_t diag, int k0, int cols) {
  return k0 + cols > p.Nk || (p.causal && k0 + cols - 1 > diag);
}
// The same for the tile [q0, q0 + rows) x [k0, k0 + cols), where a row past Nq counts as masked too (the
// backward, whose products sum over rows). In every other tile each row sees a key, so its LSE is finite.
// (Spelled out rather than calling keys_need_mask: the compiled backward kernels depend on this exact form.)
__device__ __forceinline__ bool tile_needs_mask(const AttnParams& p, int q0, int rows, int k0, int cols) {
  return q0 + rows > p.Nq || k0 + cols > p.Nk || (p.causal && int64_t(k0) + cols - 1 > p.input_pos + q0);
}

// Sets the scores of keys a row does not see to -inf. i0, i8: the query rows (position - input_pos) of this
// thread's rows g and g + 8; key_2t: absolute key of its column 2t in n-tile 0.
template <int NT>
__device__ __forceinline__ void apply_mask(float (&s)[NT][4], int i0, int i8, int key_2t, int Nk, bool causal,
                                           int64_t input_pos) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key_2t + nt * 8 + (e & 1);
      const int i = e < 2 ? i0 : i8;
      if (j >= Nk || !sees(causal, input_pos, i, j)) s[nt][e] = -INFINITY;
    }
}
// The usual tile, whose rows are consecutive query rows: row_g and row_g + 8 (4e's packed tiles are not).
template <int NT>
__device__ __forceinline__ void apply_mask(float (&s)[NT][4], int row_g, int key_2t, int Nk, bool causal,
                                           int64_t input_pos) {
  apply_mask(s, row_g, row_g + 8, key_2t, Nk, causal, input_pos);
}

}  // namespace fa::step4
