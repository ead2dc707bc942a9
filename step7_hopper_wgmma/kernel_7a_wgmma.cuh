// FlashAttention, step by step — step 7a: step 4d's kernel on warpgroup tensor cores
// (step7_hopper_wgmma/kernel_7a_wgmma.cuh)
//
// What it adds over 4d (step4_fused_pipelined/kernel_4d_tma.cuh): the two products run as wgmma (wgmma.cuh)
// instead of mma.sync. Everything else is 4d's: the TMA ring, the scheduler, the mask, the softmax, the
// epilogue, the same shared memory.
// The idea: mma.sync computes a 16-row warp tile, so every warp reads the whole K and V tile from shared memory
// into registers (ldmatrix), 16 rows of Q at a time: at d = 128, Br = 128 the 8 warps read each K/V tile 8
// times. A wgmma computes a 64-row warpgroup tile and the tensor core reads its operands from shared memory
// itself, through descriptors: each K/V tile is read twice (once per warpgroup), Q never leaves shared memory,
// and no register holds a K, V or Q fragment. wgmma is also asynchronous; 7a does not use that yet: it waits
// for each product right after issuing it (wgmma.wait_group 0), as mma.sync would.
// Paper equations (FlashAttention-2, Alg. 1, lines 8-12), per K/V tile j, for the rows of warpgroup wg:
//   S = Q_wg K_j^T (wgmma, A and B from shared memory);  m, P, l, O rescaled (softmax.h, unchanged);
//   O += P V_j (wgmma, P from registers: the accumulator layout is mma.sync's, so acc_to_a packs it).
// Limits: Br = 128 (two warpgroups), Bc and d of 64 or 128, bf16/fp16; the thread that issues the copies is
// also a consumer (as in 4d); no dropout, no score modifiers; sm_90a only.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/epilogue.cuh"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step4_fused_pipelined/softmax.h"
#include "step7_hopper_wgmma/kernel_traits.h"
#include "step7_hopper_wgmma/wgmma.cuh"

namespace fa::step7 {

// The main loop of one consumer warpgroup over the K/V tiles: 4d's loop body with both products as wgmma. 7b's
// consumers run it too. warp: the warp's index among the computing warps (it owns tile rows 16 warp .. + 15);
// q_rows: the warpgroup's 64 rows of the Q tile; after_qk(n): what runs once S_n has landed and K tile n is
// released (7a: thread 0 refills the ring there; 7b, whose producer has a loop of its own: nothing).
template <class Tr, class AfterQk>
__device__ __forceinline__ void warpgroup_loop(Smem<Tr>& sm, const AttnParams& p, const step4::QueryTileWork& w,
                                               int warp, uint32_t q_rows, float (&o)[Tr::D / 8][4],
                                               step4::RowSoftmax<Tr::Bc / 8, Tr::D / 8>& softmax, AfterQk&& after_qk) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc;
  const step4::TmaRing<Tr::kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row_g = w.m0 + 16 * warp + g;
  const step4::CausalMask mask(p);  // step 4's mask (mask.h); the tile test's rows: the warp's, within Q
  const step4::CausalMask::Span warp_rows = mask.span(w.m0 + 16 * warp, min(w.m0 + 16 * warp + 15, p.Nq - 1));
  for (int n = 0; n < w.n_tiles; ++n) {
    // S = Q K^T: [64 rows, Bc] per warpgroup, issued, then waited for at once.
    float s[Bc / 8][4];
    k_ring.wait(n);
    wgmma_fence();  // s was last written by the softmax: those writes come before the wgmma's
    warpgroup_qk<T, Br, Bc, D>(s, q_rows, ptx::smem_u32(sm.k[k_ring.slot(n)]));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    k_ring.release(n);  // the tensor core is done reading K tile n
    after_qk(n);

    const int key0 = n * Bc;
    if (mask.needs(warp_rows, key0, Bc)) step4::apply_mask(mask, s, row_g, row_g + 8, key0 + 2 * t);
    softmax.update(s, o, p.scale_log2);  // s now holds P (unnormalised), o is rescaled

    uint32_t pa[Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) step4::acc_to_a<T>(pa[kk], s, kk);

    // O += P V: [64 rows, D] per warpgroup.
    v_ring.wait(n);
    wgmma_fence();  // o (rescaled) and pa were written by ordinary instructions
    warpgroup_pv<T, Bc, D>(o, pa, ptx::smem_u32(sm.v[v_ring.slot(n)]));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    v_ring.release(n);
  }
}

// grid = ceil(Nq / Br) * Hq * B blocks, block = 256 threads (two warpgroups), dynamic shared memory kSmemBytes<Tr>.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    forward_7a(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const AttnParams p) {
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  constexpr int kSTiles = Bc / 8, kOTiles = D / 8;

  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  const step4::TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  const int warp = threadIdx.x / 32, wg = warp / 4;
  const step4::QueryTileWork w(p, step4::CausalMask(p), Br, Bc, blockIdx.x);

  auto load_k = [&](int n) { k_ring.template load<typename Tr::KVTile>(n, sm.k[0], &tm_k, n * Bc, w.bh_kv); };
  auto load_v = [&](int n) { v_ring.template load<typename Tr::KVTile>(n, sm.v[0], &tm_v, n * Bc, w.bh_kv); };

  // ---- prologue (4d's): barriers, then Q and the first kStages tiles of K and of V in flight ---------
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    k_ring.init(Tr::kConsumerWarps);
    v_ring.init(Tr::kConsumerWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    step4::tma_load_tile<typename Tr::QTile>(sm.q, &tm_q, w.m0, w.bh, &sm.q_full);
    for (int n = 0; n < kStages && n < w.n_tiles; ++n) {
      load_k(n);
      load_v(n);
    }
  }
  // Q stays in shared memory: the wgmma reads it there. This warpgroup's 64 rows start 64 rows into panel 0.
  const uint32_t q_rows = ptx::smem_u32(sm.q) + Tr::QTile::offset(64 * wg, 0);
  ptx::mbar_wait(&sm.q_full, 0);  // also before the epilogue reuses the tile, when there is no K/V tile

  // ---- main loop over K/V tiles: the producer (thread 0, as in 4d) refills after its Q K^T ---------------
  float o[kOTiles][4] = {};
  step4::RowSoftmax<kSTiles, kOTiles> softmax;
  warpgroup_loop<Tr>(sm, p, w, warp, q_rows, o, softmax, [&](int n) {
    k_ring.refill(n, w.n_tiles, load_k);  // K and V tile n + kStages - 1 into the slots of tile n - 1
    v_ring.refill(n, w.n_tiles, load_v);
  });

  // ---- epilogue (4d's): each warp stages its 16 rows over its own rows of Q (only its warpgroup's wgmmas
  // read them, and those completed) and stores them with TMA --------------------------------------------
  step4::store_o_rows<Tr>(o, softmax, sm.q, &tm_o, w.m0, w.bh, warp, p);
}

}  // namespace fa::step7
