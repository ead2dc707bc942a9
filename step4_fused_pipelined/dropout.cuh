// FlashAttention, step by step — step 4: the dropout mask on fragments (step4_fused_pipelined/dropout.cuh)
//
// The mask is one pure function of (seed, b, h, i, j) (core/dropout.h): a Philox4x32 call gives the words
// of keys 4(j / 4) .. +3 of row i, and word j % 4 decides key j. On the device:
//  - a thread's two columns 2t, 2t+1 of an n8 tile fall in one group of four keys, so one Philox call
//    serves the pair (words 0, 1 for even t, 2, 3 for odd t): dropout_pair;
//  - the word is picked with ?:, which keeps the four words in registers (w.v[j & 3] with a run-time index
//    would put them in local memory).
// Z is 0 for a dropped weight and 1 / (1 - p) for a kept one. Step 5 applies the same Z to P and dP.
#pragma once
#include <cstdint>

#include "core/dropout.h"

namespace fa::step4 {

// Z of keys j and j + 1 (j even) of row i of head (b, h).
__device__ __forceinline__ void dropout_pair(const DropoutParams& dp, int b, int h, int i, int j, float& z0, float& z1) {
  const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j) >> 2);
  const bool odd = j & 2;
  z0 = (odd ? w.v[2] : w.v[0]) >= dp.threshold ? dp.keep_scale : 0.0f;
  z1 = (odd ? w.v[3] : w.v[1]) >= dp.threshold ? dp.keep_scale : 0.0f;
}

// Z of one key j of row i (a layout whose pairs run along rows, as step 5's transposed products).
__device__ __forceinline__ float dropout_z(const DropoutParams& dp, int b, int h, int i, int j) {
  const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j) >> 2);
  const uint32_t lo = j & 1 ? w.v[1] : w.v[0], hi = j & 1 ? w.v[3] : w.v[2];
  return (j & 2 ? hi : lo) >= dp.threshold ? dp.keep_scale : 0.0f;
}

// Multiplies the probabilities in S's C fragments by Z: rows row_g and row_g + 8, keys key_2t + 8nt, +1.
template <int NT>
__device__ __forceinline__ void apply_dropout(float (&s)[NT][4], const DropoutParams& dp, int b, int h, int row_g,
                                              int key_2t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float z0, z1;
      dropout_pair(dp, b, h, row_g + 8 * r, key_2t + nt * 8, z0, z1);
      s[nt][2 * r] *= z0;
      s[nt][2 * r + 1] *= z1;
    }
}

}  // namespace fa::step4
