// FlashAttention, step by step — step 4a (and 4b): tiles in shared memory, tensor cores
// (step4_fused_pipelined/kernel_4a_threads.cuh)
//
// What it adds over step 3 (step3_naive_kernel/kernel.cuh): the same online-softmax loop, with the work of
// a block shared through shared memory and done on the tensor cores.
//  - A block owns Br = 16 x Warps query rows. Its threads copy the Q tile into shared memory once, and each
//    warp moves its 16 rows into registers (ldmatrix), where they stay for the whole loop.
//  - Per K/V tile of Bc keys, the threads copy K and V into shared memory (16 bytes per thread and copy,
//    coalesced), wait for each other (__syncthreads), and every warp reads the whole tile from there:
//    one global read of K/V per block instead of one per thread as in step 3.
//  - S = Q K^T and O += P V are mma.sync.m16n8k16 on 16-bit operands with fp32 accumulators (fragments.cuh
//    says which thread holds what); P goes from S's accumulators straight into the A operand of P V.
//  - The online softmax runs on the accumulators, two rows per thread (softmax.h); causal tiles past the
//    diagonal are never visited (scheduler.cuh) and only tiles that cross it are masked (mask.h).
//  - 4a stores tile rows padded to 144 bytes, so ldmatrix has no bank conflict; 4b is this same kernel
//    with the 128-byte swizzle instead (kernel_traits.h, SmemLayout): the same speed in 1/9 less memory,
//    and the layout TMA writes (4d).
// Paper equations (FlashAttention-2, Alg. 1, lines 8-12), per K/V tile j, rows of the block's tile i:
//   S_i^(j) = Q_i K_j^T;  m_i^(j) = max(m_i^(j-1), rowmax(S_i^(j)));  P_i^(j) = exp(S_i^(j) - m_i^(j))
//   l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_i^(j));  O_i^(j) = e^(..) O_i^(j-1) + P_i^(j) V_j
//   and at the end O_i = O_i / l_i, LSE_i = m_i + log(l_i)   (the scale is folded into exp2, softmax.h).
// Limits: while the threads copy a tile, no warp computes, and while the warps compute, nothing is copied
// (4c overlaps the two); d = 64 or 128, bf16/fp16, scale > 0.
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

// The block copies rows row0 .. row0 + Rows - 1 of a [N, D] matrix into a tile of layout Tr::kLayout. Each
// thread moves 16-byte chunks through a register; consecutive threads take consecutive chunks of a row, so
// a warp reads 512 contiguous bytes (coalesced). A thread's chunks are kRowStep rows apart: one address,
// plus constant offsets. Rows past N are zero-filled: they add nothing to S or P V.
template <class Tr, int Rows>
__device__ __forceinline__ void copy_tile(uint8_t* tile, const typename Tr::T* src, int row0, int N) {
  constexpr int kRowChunks = Tr::D / 8, kRowStep = Tr::kThreads / kRowChunks;
  static_assert(Tr::kThreads % kRowChunks == 0 && Rows % kRowStep == 0, "every thread copies whole chunks");
  const int row = threadIdx.x / kRowChunks, col = threadIdx.x % kRowChunks * 8;  // this thread's first chunk
  const typename Tr::T* from = src + int64_t(row0 + row) * Tr::D + col;
#pragma unroll
  for (int i = 0; i < Rows / kRowStep; ++i) {
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + row + i * kRowStep < N) x = *reinterpret_cast<const uint4*>(from + i * kRowStep * Tr::D);
    *reinterpret_cast<uint4*>(tile + tile_offset<Rows, Tr::kLayout>(row + i * kRowStep, col)) = x;
  }
}

// grid = (ceil(Nq / Br) * Hq * B), block = 32 * kWarps threads, dynamic shared memory kFwdSmemBytes<Tr>.
template <class Tr, bool kDropout>
__global__ void __launch_bounds__(Tr::kThreads, 1) forward_4a(const AttnParams p) {
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

  // ---- prologue: the block copies its Q tile; each warp moves its 16 rows into A fragments --------------
  copy_tile<Tr, Br>(sm.q, q, w.m0, p.Nq);
  __syncthreads();  // every thread's chunks of Q are in shared memory before any warp reads them
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
    __syncthreads();  // every warp is done reading tile n - 1 before the copies overwrite it
    copy_tile<Tr, Bc>(sm.k[0], k, n * Bc, p.Nk);
    copy_tile<Tr, Bc>(sm.v[0], v, n * Bc, p.Nk);
    __syncthreads();  // tile n is in shared memory, every thread's chunks of it

    // Dropout's keep mask of this tile depends on positions only: drawn here, where S is not yet live.
    DropoutMask keep{};
    if constexpr (kDropout) keep = DropoutMask::draw<kSTiles>(p.dropout, w.b, w.h, row_g, n * Bc + 2 * t);

    // S = Q K^T: [16 rows, Bc keys] per warp (fragments.cuh).
    float s[kSTiles][4] = {};
    const uint32_t k_base = ptx::smem_u32(sm.k[0]);
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
    const uint32_t v_base = ptx::smem_u32(sm.v[0]);
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
