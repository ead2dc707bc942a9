// FlashAttention, step by step — step 4: masking S in registers (step4_fused_pipelined/mask.h)
//
// Causal masking and the tail of K act on the S accumulators of mma.sync. A thread of the warp holds,
// for each n8 tile nt of S, four scores (mma C-fragment, common/ptx.h):
//   s[nt][0..1] = row g,     keys nt*8 + 2t, +1          (g = lane / 4, t = lane % 4)
//   s[nt][2..3] = row g + 8, keys nt*8 + 2t, +1
// Only tiles that cross the diagonal or the end of K are masked (the caller decides); all others skip
// this code entirely.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/problem.h"

namespace fa::step4 {

// row_g: absolute query row of this thread's row g; key_2t: absolute key of its column 2t in n-tile 0.
template <int NT>
__device__ __forceinline__ void apply_mask(float (&s)[NT][4], int row_g, int key_2t, int Nk, bool causal,
                                           int64_t input_pos) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key_2t + nt * 8 + (e & 1);
      const int i = row_g + (e >> 1) * 8;
      if (j >= Nk || !sees(causal, input_pos, i, j)) s[nt][e] = -INFINITY;
    }
}

}  // namespace fa::step4
