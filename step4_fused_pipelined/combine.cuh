// FlashAttention, step by step — step 4e: merging the splits (step4_fused_pipelined/combine.cuh)
//
// What it adds: the second kernel of split-KV. Split s of a row left (LSE_s, O_s), which is the online-softmax
// state (m, l, acc) = (LSE_s, 1, O_s), or the empty state (-inf, 0, 0) when the split saw no key. The row's
// result is the merge of all its splits' states: step 2's merge_states / merge_acc (core/online_softmax.h),
// the very functions the CPU stages use, compiled for the device:
//   m = max_s LSE_s;  l = sum_s e^(LSE_s - m);  O = sum_s e^(LSE_s - m) O_s / l;  LSE = m + log l.
// One warp per row; lane k holds columns k * D / 32 .. of O (contiguous, so a warp reads whole rows).
// Limits: reads every split of every row once (splits x rows x d floats): small next to K and V at decode.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/online_softmax.h"
#include "gpu/gpu_types.h"

namespace fa::step4 {

constexpr int kCombineRowsPerBlock = 4;  // one warp per row

// grid = ceil(rows / kCombineRowsPerBlock), block = 32 * kCombineRowsPerBlock threads.
// o_part [splits, rows, D], lse_part [splits, rows] -> o [rows, D] (type T), lse [rows] (if not null).
template <typename T, int D>
__global__ void __launch_bounds__(32 * kCombineRowsPerBlock)
    combine_splits(const float* o_part, const float* lse_part, int splits, int64_t rows, T* o, float* lse) {
  constexpr int kCols = D / 32;  // columns per lane
  static_assert(kCols % 2 == 0, "lanes move pairs of columns");
  const int64_t row = int64_t(blockIdx.x) * kCombineRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int col0 = (threadIdx.x % 32) * kCols;

  SoftmaxState state;      // the empty state: (-inf, 0), acc = 0
  float acc[kCols] = {};
  for (int s = 0; s < splits; ++s) {
    const int64_t at = int64_t(s) * rows + row;
    const float lse_s = lse_part[at];
    const SoftmaxState part{lse_s, lse_s == -INFINITY ? 0.0f : 1.0f};
    float o_s[kCols];
#pragma unroll
    for (int c = 0; c < kCols; c += 2) {
      const float2 v = *reinterpret_cast<const float2*>(o_part + at * D + col0 + c);
      o_s[c] = v.x;
      o_s[c + 1] = v.y;
    }
    merge_acc(acc, o_s, kCols, merge_states(state, part));
  }
  const float inv = inv_l(state);
#pragma unroll
  for (int c = 0; c < kCols; ++c) o[row * D + col0 + c] = from_float<T>(acc[c] * inv);
  if (lse && threadIdx.x % 32 == 0) lse[row] = row_lse(state);
}

}  // namespace fa::step4
