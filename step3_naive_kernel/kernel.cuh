// FlashAttention, step by step — step 3: the first CUDA kernel (step3_naive_kernel/kernel.cuh)
//
// What it adds over step 2: the same online-softmax loop, now on the GPU. One warp owns one query row
// and walks over the keys in tiles of 32 (one key per lane), keeping the state (m_i, l_i, acc_i) of
// core/online_softmax.h in registers. K and V are read straight from global memory into registers:
// no shared memory, no tensor cores. The point is to prove the logic on the device before optimising.
//
// Per tile of keys j = t0 .. t0+31 (FlashAttention-2, Algorithm 1, lines 8-10, with Br = 1, Bc = 32):
//   s_j     = scale * q_i . k_j                       one dot product per lane
//   m_new   = max(m_i, max_j s_j)                     warp shuffle reduction
//   alpha   = exp(m_i - m_new);  l_i = alpha l_i + sum_j exp(s_j - m_new)
//   acc_i   = alpha acc_i + sum_j exp(s_j - m_new) * z_j v_j     (z_j: dropout keep / (1 - p))
// and at the end O_i = acc_i / l_i, LSE_i = m_i + log(l_i).
//
// Why it is slow: every warp re-reads all of K and V from L2/HBM for its single row (no reuse across
// rows), each lane reads a different row of K (scattered 16-byte loads), the products run on the fp32
// CUDA cores (about 1/15 of the tensor cores' rate on an H100), and every weight is broadcast by a
// shuffle. Step 4 fixes all four: tiles of Q share K/V through shared memory, loaded by TMA, and
// mma.sync does the products.
//
// Score modifiers (kMods, core/score_mod.h): each score goes through modify_with_slope() and visible()
// before the softmax, and a window starts the key loop at the row's first visible key; without kMods the
// kernel is the plain one above, instruction for instruction.
#pragma once
#include <cuda_runtime.h>

#include "core/dropout.h"
#include "gpu/attn_params.h"
#include "gpu/gpu_types.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "core/score_mod.h"

namespace fa::step3 {

constexpr int kWarpsPerBlock = 4;  // 4 query rows per block: enough warps per SM to hide latency
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// q_i . k_j for one key row: D elements read with 16-byte vector loads.
template <typename T, int D>
__device__ __forceinline__ float dot_row(const float (&q)[D], const T* __restrict__ k_row) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < D; c += kVec) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k_row + c);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int u = 0; u < kVec; ++u) s += q[c + u] * to_float(e[u]);
  }
  return s;
}

// grid = (ceil(Nq / kWarpsPerBlock), Hq, B), block = 32 * kWarpsPerBlock threads; warp w owns row i.
// kMods: the score modifiers and masks of *p.mods (core/score_mod.h); launch.cu sets it only when the
// problem has one, so a plain problem runs the plain kernel.
template <typename T, int D, bool kMods = false>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) naive_forward(const AttnParams p) {
  constexpr int kCols = D / 32;  // output columns per lane: lane owns columns lane, lane + 32, ...
  const int lane = threadIdx.x % 32;
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int h = blockIdx.y, b = blockIdx.z;
  if (i >= p.Nq) return;  // whole warps leave together, so the shuffles below stay warp-uniform
  const int hk = h / p.group;

  const T* q_row = static_cast<const T*>(p.q) + ((int64_t(b) * p.Hq + h) * p.Nq + i) * D;   // [D]
  const T* K = static_cast<const T*>(p.k) + (int64_t(b) * p.Hkv + hk) * p.Nk * D;           // [Nk, D]
  const T* V = static_cast<const T*>(p.v) + (int64_t(b) * p.Hkv + hk) * p.Nk * D;           // [Nk, D]

  float q[D];  // the whole query row in every lane, pre-multiplied by the softmax scale
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = to_float(q_row[c]) * p.scale;

  float acc[kCols] = {};
  SoftmaxState st;  // (m_i, l_i) of this row; identical in all 32 lanes
  // The row reads keys first .. n_keys - 1: causal stops at the diagonal; with kMods, the mask's band of
  // visible keys (causal and window, core/score_mod.h: visible_range) bounds both ends, so a window also
  // starts the loop at its left edge: the keys before it are never read (tile skipping, in its simplest form).
  int first = 0, n_keys = int(visible_keys(p.causal, p.input_pos, p.Nk, i));
  ScoreMod mod;                     // kMods: the modifier (p.mods, in device memory; read once)
  const float* bias_row = nullptr;  // kMods: row i of the bias of (b, h), [Nk], or nullptr
  float slope = 0.0f;               // kMods: this head's ALiBi slope
  if constexpr (kMods) {
    const ModParams mp = *p.mods;
    mod = mp.mod;
    int64_t lo, hi;
    visible_range(mod, p.Nk, i, &lo, &hi);
    first = lo <= hi ? int(lo) : 0;
    n_keys = lo <= hi ? int(hi + 1) : 0;
    if (mp.bias) bias_row = mp.bias + b * mp.bias_stride_b + h * mp.bias_stride_h + int64_t(i) * p.Nk;
    slope = head_slope(mod, h);
  }

  for (int t0 = first; t0 < n_keys; t0 += 32) {
    const int j = t0 + lane;  // this lane's key
    float s = j < n_keys ? dot_row<T, D>(q, K + int64_t(j) * D) : -INFINITY;
    if constexpr (kMods)  // the modifier, then the mask: core/score_mod.h, element by element
      if (j < n_keys) s = visible(mod, i, j) ? modify_with_slope(mod, s, bias_row ? bias_row[j] : 0.0f, slope, i, j)
                                              : -INFINITY;
    // Without kMods st.m is now finite: the tile has a visible key. With them a -inf bias may mask a whole
    // tile, and st.m may still be -inf: such a score weighs 0 (not exp(-inf - -inf) = NaN).
    const float alpha = online_rescale(st, warp_max(s));
    const float p_j = (kMods ? s != -INFINITY : j < n_keys) ? expf(s - st.m) : 0.0f;
    st.l += warp_sum(p_j);  // l counts every weight, dropped or not: dropout acts after normalisation
    const float w_j = dropout_keep(p.dropout, b, h, i, j) ? p_j * p.dropout.keep_scale : 0.0f;

#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] *= alpha;
    const int n_tile = min(32, n_keys - t0);
    for (int jj = 0; jj < n_tile; ++jj) {
      const float w = __shfl_sync(kFullMask, w_j, jj);  // broadcast key jj's weight
      const T* v_row = V + int64_t(t0 + jj) * D;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] += w * to_float(v_row[c * 32 + lane]);  // coalesced
    }
  }

  T* o_row = static_cast<T*>(p.o) + ((int64_t(b) * p.Hq + h) * p.Nq + i) * D;
  const float inv = inv_l(st);  // 0 for a row that saw no key: O = 0
#pragma unroll
  for (int c = 0; c < kCols; ++c) o_row[c * 32 + lane] = from_float<T>(acc[c] * inv);
  if (lane == 0 && p.lse) p.lse[(int64_t(b) * p.Hq + h) * p.Nq + i] = row_lse(st);
}

}  // namespace fa::step3
