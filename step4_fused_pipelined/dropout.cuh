// FlashAttention, step by step — step 4: the dropout mask on fragments (step4_fused_pipelined/dropout.cuh)
//
// The mask is one pure function of (seed, b, h, i, j) (core/dropout.h): a Philox4x32 call gives the words
// of keys 4(j / 4) .. +3 of row i, and word j % 4 decides key j. On the device:
//  - a thread's two columns 2t, 2t+1 of an n8 tile fall in one group of four keys, so one Philox call
//    serves the pair (words 0, 1 for even t, 2, 3 for odd t): dropout_pair;
//  - the neighbour t ^ 1 needs the other two words of the same call, for both of their rows: the
//    forward's DropoutMask lets each of the two draw one row and swap keep bits, one Philox call per pair
//    of elements instead of two;
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

// The keep mask of one K/V tile for a thread's fragment positions: rows row_g and row_g + 8, keys
// key_2t + 8nt, +1 of each n-tile nt; bit 2nt + e of `g` (`g8`) keeps column e of n-tile nt in row g (g + 8).
// Threads t and t ^ 1 of a quad need the same two Philox calls per n-tile (rows g and g + 8, one group of
// four keys). So each makes one, for row g + 8 (t & 1): it keeps the bits of its own columns and collects
// those of its partner's columns, and one shuffle swaps them: half the Philox work of dropout_pair per
// element pair. The mask depends on positions only, so a kernel can draw it while few registers are live.
struct DropoutMask {
  uint32_t g, g8;

  template <int NT>
  __device__ __forceinline__ static DropoutMask draw(const DropoutParams& dp, int b, int h, int row_g, int key_2t) {
    static_assert(2 * NT <= 32, "two keep bits per n-tile in one 32-bit mask");
    const bool odd = key_2t & 2;            // this thread's columns are words 2, 3 of their group (else 0, 1)
    const bool own_row8 = threadIdx.x & 1;  // this thread draws row g + 8 (t odd), its partner row g
    const uint32_t row = uint32_t(row_g + (own_row8 ? 8 : 0)), group = uint32_t(key_2t) >> 2;
    uint32_t own = 0, give = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), row, group + 2 * nt);  // keys of tile nt
      own |= uint32_t((odd ? w.v[2] : w.v[0]) >= dp.threshold) << (2 * nt);
      own |= uint32_t((odd ? w.v[3] : w.v[1]) >= dp.threshold) << (2 * nt + 1);
      give |= uint32_t((odd ? w.v[0] : w.v[2]) >= dp.threshold) << (2 * nt);
      give |= uint32_t((odd ? w.v[1] : w.v[3]) >= dp.threshold) << (2 * nt + 1);
    }
    const uint32_t got = __shfl_xor_sync(0xffffffffu, give, 1);  // the partner's draw of the other row
    return own_row8 ? DropoutMask{got, own} : DropoutMask{own, got};
  }

  // Z (0 or keep_scale) of element e of n-tile nt of a C fragment: row g + 8 (e / 2), column 2t + e % 2.
  __device__ __forceinline__ float z(int nt, int e, float keep_scale) const {
    return (e < 2 ? g : g8) >> (2 * nt + e % 2) & 1u ? keep_scale : 0.0f;
  }
  // Multiplies the probabilities in S's C fragments by Z.
  template <int NT>
  __device__ __forceinline__ void apply(float (&s)[NT][4], float keep_scale) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= z(nt, e, keep_scale);
  }
};

}  // namespace fa::step4
