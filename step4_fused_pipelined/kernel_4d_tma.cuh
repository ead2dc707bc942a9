// FlashAttention, step by step — step 4d: the fused, TMA-pipelined tensor-core kernel, step 4's default
// (step4_fused_pipelined/kernel_4d_tma.cuh)
//
// What it adds over 4c (kernel_4c_cp_async.cuh): the threads no longer copy. One thread issues TMA bulk
// copies into a ring of stages guarded by mbarriers (ring.cuh), and O leaves through a TMA store.
// The whole kernel, read on its own: the online-softmax loop (FlashAttention-2, Algorithm 1) with the
// data movement and the arithmetic of a real kernel:
//  - a block owns Br = 16 x Warps query rows; TMA copies its Q tile into shared memory once, ldmatrix moves
//    it into registers, and it stays there for the whole loop;
//  - K and V tiles of Bc keys stream through a ring of `Stages` shared-memory buffers filled by TMA
//    (cp.async.bulk.tensor). Each stage has a "full" mbarrier per tensor (TMA signals the bytes landed)
//    and an "empty" one (every warp signals it is done reading), so the copies of tile j+1.. overlap the
//    math of tile j;
//  - 128-byte swizzled tiles (TMA writes them, ldmatrix reads them without bank conflicts);
//  - S = Q K^T and O += P V on the tensor cores (mma.sync.m16n8k16, fp32 accumulators); P goes from the
//    S accumulators straight into A fragments: no shared-memory round trip;
//  - the mask is a type (mask.h): causal tiles above the diagonal are never loaded, and only tiles that
//    cross it are masked. 4e's score modifiers (score_mod.cuh) are another mask type: this kernel runs them.
// Paper equations (FlashAttention-2, Alg. 1, lines 8-12), per K/V tile j, rows of the block's tile i:
//   S_i^(j) = Q_i K_j^T;  m_i^(j) = max(m_i^(j-1), rowmax(S_i^(j)));  P_i^(j) = exp(S_i^(j) - m_i^(j))
//   l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_i^(j));  O_i^(j) = e^(..) O_i^(j-1) + P_i^(j) V_j
//   and at the end O_i = O_i / l_i, LSE_i = m_i + log(l_i)   (the scale is folded into exp2, softmax.h).
// Its building blocks live in files of their own, which step 5 includes: ring.cuh (the TMA ring, new in
//   4d); fragments.cuh (layouts, ldmatrix loaders, P-to-A), scheduler.cuh (which tile), mask.h, dropout.cuh
//   and softmax.h (the online softmax on fragments), all from 4a; kernel_traits.h (tiles, shared memory);
//   epilogue.cuh (a warp's rows of O out through TMA).
// Limits: d = 64 or 128, bf16/fp16, scale > 0; every warp reads the whole K and V tile from shared memory
// (the cost of 16-row warp tiles with mma.sync); no warp specialisation (sm_120 has no setmaxnreg).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/dropout.cuh"
#include "step4_fused_pipelined/epilogue.cuh"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/kernel_traits.h"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step4_fused_pipelined/softmax.h"

namespace fa::step4 {

// grid = (ceil(Nq / Br) * Hq * B), block = 32 * kWarps threads, dynamic shared memory kFwdSmemBytes<Tr>.
template <class Tr, bool kDropout, class Mask = CausalMask>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    fused_forward(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                  const AttnParams p) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  constexpr SmemLayout kL = Tr::kLayout;
  constexpr int kQSteps = D / 16;  // k16 steps of Q K^T
  constexpr int kSTiles = Bc / 8;  // n8 tiles of S
  constexpr int kOTiles = D / 8;   // n8 tiles of O

  FA_KERNEL_NEEDS_SMEM(kFwdSmemBytes<Tr>);  // more than this GPU's blocks may have: a trap (gpu/gpu_types.h)
  extern __shared__ uint8_t smem_raw[];
  FwdSmem<Tr>& sm = *reinterpret_cast<FwdSmem<Tr>*>(align_1024(smem_raw));
  const TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const Mask mask(p);                                // which keys each row sees (mask.h)
  const QueryTileWork w(p, mask, Br, Bc, blockIdx.x, Tr::kOrder);  // which query tile, which K/V tiles (scheduler.cuh)

  // One thread issues every TMA copy: K (or V) tile n into its ring's slot.
  auto load_k = [&](int n) { k_ring.template load<typename Tr::KVTile>(n, sm.k[0], &tm_k, (w.n_begin + n) * Bc, w.bh_kv); };
  auto load_v = [&](int n) { v_ring.template load<typename Tr::KVTile>(n, sm.v[0], &tm_v, (w.n_begin + n) * Bc, w.bh_kv); };
  // The producer, in iteration n >= 1: K and V tile n + kStages - 1 into the slots of tile n - 1, which every
  // warp released in its previous iteration (K after its Q K^T, V after its P V).
  auto refill = [&](int n) {
    k_ring.refill(n, w.n_tiles, load_k);
    v_ring.refill(n, w.n_tiles, load_v);
  };

  // ---- prologue: barriers, then Q and the first kStages tiles of K and of V in flight -----------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    k_ring.init(Tr::kWarps);
    v_ring.init(Tr::kWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    tma_load_tile<typename Tr::QTile>(sm.q, &tm_q, w.m0, w.bh, &sm.q_full);
    for (int n = 0; n < kStages && n < w.n_tiles; ++n) {
      load_k(n);
      load_v(n);
    }
  }

  // Q: shared -> registers, once. Warp w reads rows 16w .. 16w+15 as A fragments of every k16 step.
  ptx::mbar_wait(&sm.q_full, 0);
  uint32_t q[kQSteps][4];
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) load_a<Br, kL>(q[kk], ptx::smem_u32(sm.q), 16 * warp, kk);

  // ---- main loop over K/V tiles -----------------------------------------------------------------------
  float o[kOTiles][4] = {};  // O accumulators: rows g, g+8; columns nd*8 + 2t, +1
  RowSoftmax<kSTiles, kOTiles> softmax;
  const int row_g = w.m0 + 16 * warp + g;  // absolute query row of this thread's row g
  const typename Mask::Row r_g = mask.row(w.b, w.h, row_g), r_g8 = mask.row(w.b, w.h, row_g + 8);  // as the mask sees them
  // The tile test's rows: the warp's, within Q (the forward stores no row past the end of Q).
  const typename Mask::Span warp_rows = mask.span(w.m0 + 16 * warp, min(w.m0 + 16 * warp + 15, p.Nq - 1));

  for (int n = 0; n < w.n_tiles; ++n) {
    if constexpr (kStages == 1) refill(n);  // one slot: tile n can only be loaded once n-1 is released

    // Dropout's keep mask of this tile depends on positions only: drawn here, where S is not yet live.
    DropoutMask keep{};
    if constexpr (kDropout) keep = DropoutMask::draw<kSTiles>(p.dropout, w.b, w.h, row_g, (w.n_begin + n) * Bc + 2 * t);

    // S = Q K^T: [16 rows, Bc keys] per warp (fragments.cuh).
    float s[kSTiles][4] = {};
    k_ring.wait(n);  // K tile n has landed
    const uint32_t k_base = ptx::smem_u32(sm.k[k_ring.slot(n)]);
    warp_qk<T, Bc, D, kL>(s, q, k_base);
    k_ring.release(n);

    if constexpr (kStages > 1) refill(n);  // after this warp's Q K^T: the other warps are likely done with n-1

    // Mask only where needed: a tile that crosses an end or this warp's diagonal (mask.h's needs).
    const int key0 = (w.n_begin + n) * Bc;
    if (mask.needs(warp_rows, key0, Bc)) apply_mask(mask, s, r_g, r_g8, key0 + 2 * t);

    softmax.update(s, o, p.scale_log2);  // s now holds P (unnormalised), o is rescaled
    if constexpr (kDropout) keep.apply(s, p.dropout.keep_scale);

    // P: fp32 C fragments of two n8 tiles = one 16-bit A fragment of a k16 step of P V.
    uint32_t pa[Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) acc_to_a<T>(pa[kk], s, kk);

    // O += P V: [16 rows, D] per warp (fragments.cuh).
    v_ring.wait(n);  // V tile n has landed
    const uint32_t v_base = ptx::smem_u32(sm.v[v_ring.slot(n)]);
    warp_pv<T, Bc, D, kL>(o, pa, v_base);

    v_ring.release(n);
  }

  // ---- epilogue: normalise, stage O in this warp's own rows of the Q tile, TMA store (epilogue.cuh) -----
  store_o_rows<Tr>(o, softmax, sm.q, &tm_o, w.m0, w.bh, warp, p);
}

}  // namespace fa::step4
