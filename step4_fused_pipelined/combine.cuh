// FlashAttention, step by step — step 4f: merging the splits (step4_fused_pipelined/combine.cuh)
//
// What it adds: the second kernel of split-KV. Split s of a row left (LSE_s, O_s), which is the online-softmax
// state (m, l, acc) = (LSE_s, 1, O_s), or the empty state (-inf, 0, 0) when the split saw no key. The row's
// result is the merge of all its splits' states, with step 2's merge_states (core/online_softmax.h), the very
// function the CPU stages use, compiled for the device:
//   m = max_s LSE_s;  l = sum_s e^(LSE_s - m);  O = sum_s e^(LSE_s - m) O_s / l;  LSE = m + log l.
// One warp per row, in two parts:
//   1. the scalars: lane k merges the states of splits k, k + 32, ..., then five shuffle rounds merge the
//      lanes' states pairwise (a tree: the merge is associative and commutative, so any order gives the
//      same state), and every lane holds the row's (m, l);
//   2. the vectors: with m and l known, split s contributes e^(LSE_s - m) / l times O_s. The terms do not
//      depend on one another, so the loads of many splits are in flight at once (a chain of merges, or a
//      loop with a branch per split, waits for one split's O before the next: 32 splits x a memory round
//      trip, 15 us on the H100; docs/history/step4.md#4e-the-merge-kernel-rewritten-twice). No address waits for m or l either: the LSEs and the
//      O of the first 32 splits are requested together, before part 1, so a decode row's merge costs one
//      round trip, not three (LSEs, LSEs again for the weights, then O).
// Lane k holds columns k * D / 32 .. of O (contiguous, so a warp reads whole rows).
// merge_row is the work of one warp on one row: the combine kernel runs it on every row, and the split kernel's
// last block of a short query tile runs it on that tile's rows (kernel_4f_split_kv.cuh), with no second kernel.
// Limits: reads every split of every row once (splits x rows x d floats): small next to K and V at decode.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/online_softmax.h"
#include "gpu/gpu_types.h"
#include "gpu/ptx.h"

namespace fa::step4 {

constexpr int kCombineRowsPerBlock = 4;  // one warp per row

// One warp merges row `row` of o_part [splits, rows, D], lse_part [splits, rows] into o [rows, D] (type T) and
// lse [rows] (if not null). Called by every lane of the warp. kViaL2: the splits were written by other blocks
// of the same grid (the split kernel's last block merges short tiles itself), so the loads bypass L1 (__ldcg),
// which may hold an older copy of a line; the combine kernel, a later grid, loads plainly (with __ldcg it ran
// up to 16 % slower on the H100: docs/history/step4.md#4e-the-in-kernel-merge-of-short-tiles).
template <typename T, int D, bool kViaL2>
__device__ __forceinline__ void merge_row(const float* o_part, const float* lse_part, int splits, int64_t rows,
                                          int64_t row, int lane, T* o, float* lse) {
  constexpr int kCols = D / 32;  // columns per lane
  static_assert(kCols % 2 == 0, "lanes move pairs of columns");
  const int col0 = lane * kCols;
  auto load = [](const auto* at) {
    if constexpr (kViaL2) return __ldcg(at);
    else return *at;
  };
  auto o_of = [&](int s) { return reinterpret_cast<const float2*>(o_part + (int64_t(s) * rows + row) * D + col0); };
  auto split_state = [&](float lse_s) { return partial_state(lse_s); };  // (LSE_s, 1), or empty (core/online_softmax.h)

  // 0. Every load the merge of the first kEarly splits needs, issued together: lane k's LSE of split k, and
  //    the lane's columns of O of splits 0 .. kEarly-1 (their addresses do not wait for the weights). A decode
  //    row has a few splits: its merge then costs one memory round trip, not one per step below.
  constexpr int kEarly = 32;
  const float lse_lane = lane < splits ? load(lse_part + int64_t(lane) * rows + row) : -INFINITY;
  float2 early[kEarly][kCols / 2];
#pragma unroll
  for (int j = 0; j < kEarly; ++j)
#pragma unroll
    for (int c = 0; c < kCols / 2; ++c) early[j][c] = j < splits ? load(o_of(j) + c) : make_float2(0.0f, 0.0f);

  // 1. The row's state: each lane's splits, then a butterfly of merges across the lanes.
  SoftmaxState state = split_state(lse_lane);
  for (int s = lane + 32; s < splits; s += 32) merge_states(state, split_state(load(lse_part + int64_t(s) * rows + row)));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge_states(state, SoftmaxState{__shfl_xor_sync(0xffffffffu, state.m, offset),
                                     __shfl_xor_sync(0xffffffffu, state.l, offset)});
  const float inv = inv_l(state);

  // 2. O = sum_s e^(LSE_s - m) / l * O_s: lane k computes the weight of split k (of base + k past kEarly), and a
  //    shuffle hands each weight to the whole warp. No term waits for another, and the loop body has no branch,
  //    so the loads of many splits are in flight at once.
  float acc[kCols] = {};
  const float m = state.m == -INFINITY ? 0.0f : state.m;  // all splits empty: every weight is e^-inf = 0
  auto add = [&](float w, const float2* v) {
#pragma unroll
    for (int c = 0; c < kCols / 2; ++c) {
      acc[2 * c] += w * v[c].x;
      acc[2 * c + 1] += w * v[c].y;
    }
  };
  const float w_first = expf(lse_lane - m) * inv;  // 0 for a lane past the last split (e^-inf)
#pragma unroll
  for (int j = 0; j < kEarly; ++j) add(__shfl_sync(0xffffffffu, w_first, j), early[j]);
  for (int base = kEarly; base < splits; base += 32) {
    const int s_lane = base + lane, n = min(32, splits - base);
    const float w_lane = s_lane < splits ? expf(load(lse_part + int64_t(s_lane) * rows + row) - m) * inv : 0.0f;
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      float2 v[kCols / 2];
#pragma unroll
      for (int c = 0; c < kCols / 2; ++c) v[c] = load(o_of(base + j) + c);
      add(__shfl_sync(0xffffffffu, w_lane, j), v);
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) o[row * D + col0 + c] = from_float<T>(acc[c]);
  if (lse && lane == 0) lse[row] = row_lse(state);
}

// grid = ceil(rows / kCombineRowsPerBlock), block = 32 * kCombineRowsPerBlock threads.
// o_part [splits, rows, D], lse_part [splits, rows] -> o [rows, D] (type T), lse [rows] (if not null).
template <typename T, int D>
__global__ void __launch_bounds__(32 * kCombineRowsPerBlock)
    combine_splits(const float* o_part, const float* lse_part, int splits, int64_t rows, T* o, float* lse) {
  // Launched as a programmatic dependent of the split kernel: nothing may be read before it has finished.
  ptx::wait_for_prerequisites();
  const int64_t row = int64_t(blockIdx.x) * kCombineRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  merge_row<T, D, false>(o_part, lse_part, splits, rows, row, threadIdx.x % 32, o, lse);
}

}  // namespace fa::step4
