// FlashAttention, step by step — step 5: the small kernels around the main ones
// (step5_backward/preprocess.cuh): D = rowsum(dO * O) before them, and after them the atomic variant's dQ
// conversion and, with a bias, dBias's finish: dS_pre summed over the dimensions a broadcast bias spans,
// zeros where the mask hides a score.
//
// FlashAttention-2, Algorithm 2: D_i = rowsum(dO_i o O_i), one fp32 number per query row. It
// stands for rowsum(P_i o dP_i) (README.md derives why), the term every dS = P o (dP - D) needs; computing
// it once here, from O and dO alone, keeps the main kernels from carrying it (and its registers).
// Shapes: O, dO [B, Hq, Nq, d] (16-bit) -> D [B, Hq, Nq] (fp32). One warp per row.
#pragma once
#include <cstdint>

#include "core/score_mod.h"
#include "gpu/gpu_types.h"
#include "gpu/ptx.h"

namespace fa::step5 {

constexpr int kPreprocessWarps = 8;  // rows per block of 256 threads

// grid = ceil(rows / kPreprocessWarps), block = 32 * kPreprocessWarps; rows = B * Hq * Nq. kPacked: O and dO
// are a packed batch's [total_q, Hq, d] (rows = total_q * heads), and D goes where the LSE is, [Hq, total_q].
template <typename T, bool kPacked = false>
__global__ void __launch_bounds__(32 * kPreprocessWarps)
    preprocess_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ dsum, int64_t rows, int d,
                      int heads = 1) {
  const int64_t row = int64_t(blockIdx.x) * kPreprocessWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.0f;
  for (int c = lane; c < d; c += 32) acc += to_float(o[row * d + c]) * to_float(dout[row * d + c]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) dsum[kPacked ? row % heads * (rows / heads) + row / heads : row] = acc;
}

constexpr int kConvertThreads = 256;

// Atomic variant, after the dK/dV kernel: dQ = scale * dQacc, rounded to T. Shapes: dQacc fp32 and dQ
// [B, Hq, Nq, d], `elems` elements (even: d is); each thread converts one pair.
template <typename T>
__global__ void __launch_bounds__(kConvertThreads)
    convert_dq_kernel(const float* __restrict__ acc, T* __restrict__ dq, int64_t elems, float scale) {
  const int64_t pair = int64_t(blockIdx.x) * kConvertThreads + threadIdx.x;
  if (2 * pair >= elems) return;
  const float2 v = reinterpret_cast<const float2*>(acc)[pair];
  reinterpret_cast<uint32_t*>(dq)[pair] = ptx::pack2<T>(v.x * scale, v.y * scale);
}

constexpr int kDBiasThreads = 256;

// With a bias, after the kernels: dBias out of the dS_pre they stored ([B, Hq, Nq, Nk] fp32, ds; device.cuh,
// DBiasRows). They store every element of the query tiles they visit, and those hold every visible (i, j)
// (core/score_mod.h); the tiles a mask (causal, window) hides from a block's keys they never touch, so no
// memset clears ds beforehand: an element outside its row's visible keys [lo, hi] is 0 without being read.
//   ds != dbias (a bias broadcast over the batches, Bb = 1 < B, or the heads, Hb = 1 < Hq): dBias = ds
//     summed over those dimensions, in a fixed order (the same bits every run).
//   ds == dbias (a full bias [B, Hq, Nq, Nk], written in place): the elements outside [lo, hi] set to 0,
//     the others left as they are; needed only where a mask hides some.
// (The atomic kernel adds a broadcast bias's dS_pre into dBias itself, zeroed before: no finish.)
// One block per row: grid = Bb * Hb * Nq, row = (bb * Hb + hb) * Nq + i. A template only so that the
// header can be included by several translation units.
template <typename F>
__global__ void __launch_bounds__(kDBiasThreads)
    finish_dbias_kernel(const F* ds, F* dbias, ScoreMod mask, int B, int Hq, int Bb, int Hb, int Nq, int Nk) {
  const int64_t row = blockIdx.x;
  const int i = int(row % Nq), bh = int(row / Nq), hb = bh % Hb, bb = bh / Hb;
  int64_t lo, hi;
  visible_range(mask, Nk, i, &lo, &hi);
  F* out = dbias + row * Nk;
  for (int j = threadIdx.x; j < Nk; j += kDBiasThreads) {
    const bool vis = j >= lo && j <= hi;
    if (ds == dbias) {
      if (!vis) out[j] = 0;
      continue;
    }
    F acc = 0;
    if (vis)
      for (int b = Bb == 1 ? 0 : bb; b < (Bb == 1 ? B : bb + 1); ++b)
        for (int h = Hb == 1 ? 0 : hb; h < (Hb == 1 ? Hq : hb + 1); ++h)
          acc += ds[((int64_t(b) * Hq + h) * Nq + i) * Nk + j];
    out[j] = acc;
  }
}

}  // namespace fa::step5
