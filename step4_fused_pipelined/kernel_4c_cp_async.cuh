// FlashAttention, step by step — step 4c: copies that overlap the math (step4_fused_pipelined/kernel_4c_cp_async.cuh)
//
// What it adds over 4a/4b (kernel_4a_threads.cuh): in 4a the warps wait while the tile is copied, and
// nothing is copied while they compute. Here the threads issue the copies of tile j + 1 with cp.async
// before they compute on tile j: cp.async moves the 16 bytes from global to shared memory in the
// background, without a register, so the copy runs under the math. Two K/V buffers take turns (double
// buffering): tile j lives in buffer j % 2. One __syncthreads per tile says both "tile j has landed for
// every thread" and "every warp is done with tile j - 1", whose buffer the next copies fill.
// Everything else is 4b's kernel: the swizzled tiles, mma.sync, the online softmax, the epilogue.
// Paper equations (FlashAttention-2, Alg. 1, lines 8-12), per K/V tile j, rows of the block's tile i:
//   S_i^(j) = Q_i K_j^T;  m_i^(j) = max(m_i^(j-1), rowmax(S_i^(j)));  P_i^(j) = exp(S_i^(j) - m_i^(j))
//   l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_i^(j));  O_i^(j) = e^(..) O_i^(j-1) + P_i^(j) V_j
//   and at the end O_i = O_i / l_i, LSE_i = m_i + log(l_i)   (the scale is folded into exp2, softmax.h).
// Limits: every thread still computes the addresses of its copies and waits for its own (4d hands the
// copies to TMA and one thread); only one tile ahead; d = 64 or 128, bf16/fp16, scale > 0.
#pragma once
#include <cuda_runtime.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/dropout.cuh"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/kernel_traits.h"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step4_fused_pipelined/softmax.h"

namespace fa::step4 {

// 4a's copy_tile with cp.async: the block starts copying rows row0 .. row0 + Rows - 1 of a [N, D] matrix
// into a tile of layout Tr::kLayout and goes on; ptx::cp_async_wait says when this thread's copies landed.
// A chunk of a row past N is not copied: the thread stores zeros there itself.
template <class Tr, int Rows>
__device__ __forceinline__ void cp_async_tile(uint8_t* tile, const typename Tr::T* src, int row0, int N) {
  constexpr int kRowChunks = Tr::D / 8, kRowStep = Tr::kThreads / kRowChunks;
  static_assert(Tr::kThreads % kRowChunks == 0 && Rows % kRowStep == 0, "every thread copies whole chunks");
  const int row = threadIdx.x / kRowChunks, col = threadIdx.x % kRowChunks * 8;  // this thread's first chunk
  const typename Tr::T* from = src + int64_t(row0 + row) * Tr::D + col;
#pragma unroll
  for (int i = 0; i < Rows / kRowStep; ++i) {
    uint8_t* to = tile + tile_offset<Rows, Tr::kLayout>(row + i * kRowStep, col);
    if (row0 + row + i * kRowStep < N) ptx::cp_async_16(ptx::smem_u32(to), from + i * kRowStep * Tr::D);
    else *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
  }
}

// grid = (ceil(Nq / Br) * Hq * B), block = 32 * kWarps threads, dynamic shared memory kFwdSmemBytes<Tr>.
template <class Tr, bool kDropout>
__global__ void __launch_bounds__(Tr::kThreads, 1) forward_4c(const AttnParams p) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc;
  constexpr SmemLayout kL = Tr::kLayout;
  constexpr int kQSteps = D / 16;  // k16 steps of Q K^T
  constexpr int kSTiles = Bc / 8;  // n8 tiles of S
  constexpr int kOTiles = D / 8;   // n8 tiles of O

  FA_KERNEL_NEEDS_SMEM(kFwdSmemBytes<Tr>);  // more than this GPU's blocks may have: a trap (gpu/gpu_types.h)
  extern __shared__ uint8_t smem_raw[];
  CopySmem<Tr>& sm = *reinterpret_cast<CopySmem<Tr>*>(align_1024(smem_raw));

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const CausalMask mask(p);              // which keys each row sees (mask.h)
  const QueryTileWork w(p, mask, Br, Bc, blockIdx.x);  // which query tile, which K/V tiles (scheduler.cuh)
  const T* q = static_cast<const T*>(p.q) + int64_t(w.bh) * p.Nq * D;     // [Nq, D] of this query head
  const T* k = static_cast<const T*>(p.k) + int64_t(w.bh_kv) * p.Nk * D;  // [Nk, D] of its KV head
  const T* v = static_cast<const T*>(p.v) + int64_t(w.bh_kv) * p.Nk * D;

  // ---- prologue: Q and K/V tile 0 in flight, one commit group each; wait for Q, into A fragments --------
  cp_async_tile<Tr, Br>(sm.q, q, w.m0, p.Nq);
  ptx::cp_async_commit();
  if (w.n_tiles > 0) {
    cp_async_tile<Tr, Bc>(sm.k[0], k, 0, p.Nk);
    cp_async_tile<Tr, Bc>(sm.v[0], v, 0, p.Nk);
  }
  ptx::cp_async_commit();   // (an empty group when there is no tile: it completes at once)
  ptx::cp_async_wait<1>();  // this thread's Q copies landed (tile 0's may still be in flight)
  __syncthreads();          // ... and every thread's, before any warp reads Q
  uint32_t qa[kQSteps][4];
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) load_a<Br, kL>(qa[kk], ptx::smem_u32(sm.q), 16 * warp, kk);

  // ---- main loop over K/V tiles -----------------------------------------------------------------------
  float o[kOTiles][4] = {};  // O accumulators: rows g, g+8; columns nd*8 + 2t, +1
  RowSoftmax<kSTiles, kOTiles> softmax;
  const int row_g = w.m0 + 16 * warp + g;  // absolute query row of this thread's row g
  // The tile test's rows: the warp's, within Q (the forward stores no row past the end of Q).
  const CausalMask::Span warp_rows = mask.span(w.m0 + 16 * warp, min(w.m0 + 16 * warp + 15, p.Nq - 1));

  for (int n = 0; n < w.n_tiles; ++n) {
    ptx::cp_async_wait<0>();  // this thread's copies of tile n landed
    __syncthreads();  // every thread's copies of tile n landed, and every warp is done with tile n - 1 ...
    if (n + 1 < w.n_tiles) {  // ... so tile n + 1 may go into its buffer while this one is used
      cp_async_tile<Tr, Bc>(sm.k[(n + 1) % 2], k, (n + 1) * Bc, p.Nk);
      cp_async_tile<Tr, Bc>(sm.v[(n + 1) % 2], v, (n + 1) * Bc, p.Nk);
      ptx::cp_async_commit();
    }

    // Dropout's keep mask of this tile depends on positions only: drawn here, where S is not yet live.
    DropoutMask keep{};
    if constexpr (kDropout) keep = DropoutMask::draw<kSTiles>(p.dropout, w.b, w.h, row_g, n * Bc + 2 * t);

    // S = Q K^T: [16 rows, Bc keys] per warp (fragments.cuh).
    float s[kSTiles][4] = {};
    const uint32_t k_base = ptx::smem_u32(sm.k[n % 2]);
    warp_qk<T, Bc, D, kL>(s, qa, k_base);

    // Mask only where needed: the tail of K, or a tile that crosses this warp's diagonal.
    const int key0 = n * Bc;
    if (mask.needs(warp_rows, key0, Bc)) apply_mask(mask, s, row_g, row_g + 8, key0 + 2 * t);

    softmax.update(s, o, p.scale_log2);  // s now holds P (unnormalised), o is rescaled
    if constexpr (kDropout) keep.apply(s, p.dropout.keep_scale);

    // P: fp32 C fragments of two n8 tiles = one 16-bit A fragment of a k16 step of P V.
    uint32_t pa[Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) acc_to_a<T>(pa[kk], s, kk);

    // O += P V: [16 rows, D] per warp (fragments.cuh).
    const uint32_t v_base = ptx::smem_u32(sm.v[n % 2]);
    warp_pv<T, Bc, D, kL>(o, pa, v_base);
  }

  // ---- epilogue: normalise; each thread stores its own elements of O straight to global memory ----------
  float inv_l[2], lse[2];
  softmax.finish(inv_l, lse, p.scale_log2);
  T* o_bh = static_cast<T*>(p.o) + int64_t(w.bh) * p.Nq * D;  // [Nq, D] of this query head
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (row_g + 8 * r < p.Nq)
#pragma unroll
      for (int nd = 0; nd < kOTiles; ++nd)  // columns 8nd + 2t, +1: the four threads of a quad write 16 bytes
        *reinterpret_cast<uint32_t*>(o_bh + int64_t(row_g + 8 * r) * D + nd * 8 + 2 * t) =
            ptx::pack2<T>(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
  if (p.lse && t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_g + 8 * r < p.Nq) p.lse[int64_t(w.bh) * p.Nq + row_g + 8 * r] = lse[r];
}

}  // namespace fa::step4
