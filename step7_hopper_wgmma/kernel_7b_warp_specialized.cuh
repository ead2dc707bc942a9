// FlashAttention, step by step — step 7b: warp specialization (step7_hopper_wgmma/kernel_7b_warp_specialized.cuh)
//
// What it adds over 7a: the warps split into roles. Warpgroup 0 is the producer: one of its threads issues
// every TMA copy, the rest idle; warpgroups 1 and 2 are the consumers, 64 query rows each, and never copy.
// The idea (FlashAttention-3, section 3.1, "producer-consumer asynchrony through warp specialization"):
//  - in 7a the thread that refills the ring is a consumer, so a refill waits for that thread's own softmax
//    and its math waits for the refill; a producer of its own issues each copy the moment a slot is free;
//  - the producer needs almost no registers, the consumers need many (S, P and O fragments): setmaxnreg
//    moves them. The block starts with 168 per thread (65536 / 384 = 170, rounded down to a multiple of 8, as
//    __launch_bounds__ tells ptxas); the producer drops to
//    24, each consumer rises to 240 (kernel_traits.h), so the consumers hold their fragments without spilling.
// The ring protocol is 4d's (ring.cuh): full barriers signalled by TMA, empty barriers by the 8 consumer
// warps; only who waits on "empty" changes (the producer, in its own loop, instead of thread 0 mid-iteration).
// Limits: as 7a.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/epilogue.cuh"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/paged_kv.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step4_fused_pipelined/softmax.h"
#include "step7_hopper_wgmma/kernel_7a_wgmma.cuh"
#include "step7_hopper_wgmma/kernel_traits.h"
#include "step7_hopper_wgmma/wgmma.cuh"

namespace fa::step7 {

// The producer's loop, run by one thread: Q into sm.q (completing q_full), then K and V tile n into slot
// n % kStages as soon as the 8 consumer warps have released that slot's previous tile (n - kStages).
// 7c runs it as it is. Where the tiles lie is kv's (step 4's policies, paged_kv.h): the dense [BH, N, d] rows,
// or a packed batch's (7e).
template <class Tr, class S, class Kv = step4::ContiguousKv>
__device__ __forceinline__ void produce(S& sm, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                        const CUtensorMap* tm_v, const step4::QueryTileWork& w, const Kv& kv = {}) {
  constexpr int Bc = Tr::Bc, kStages = Tr::kStages;
  const step4::TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  const step4::KvTileAt qa = kv.q_tile(w.b, w.bh, w.m0);
  step4::tma_load_tile<typename Tr::QTile>(sm.q, tm_q, qa.row, qa.bh, &sm.q_full);
  for (int n = 0; n < w.n_tiles; ++n) {
    const int s = k_ring.slot(n);
    if (n >= kStages) ptx::mbar_wait(&sm.k_empty[s], k_ring.parity(n - kStages));  // tile n - kStages released
    const step4::KvTileAt at = kv.tile(w.b, w.bh_kv, n * Bc);
    k_ring.template load<typename Tr::KVTile>(n, sm.k[0], tm_k, at.row, at.bh);
    if (n >= kStages) ptx::mbar_wait(&sm.v_empty[s], v_ring.parity(n - kStages));
    v_ring.template load<typename Tr::KVTile>(n, sm.v[0], tm_v, at.row, at.bh);
  }
}

// grid = ceil(Nq / Br) * Hq * B blocks, block = 384 threads (producer + two consumer warpgroups).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    forward_7b(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const AttnParams p) {
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  constexpr int kSTiles = Bc / 8, kOTiles = D / 8;

  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  const step4::TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  const int wg = threadIdx.x / 128;
  const step4::QueryTileWork w(p, step4::CausalMask(p), Br, Bc, blockIdx.x);

  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    k_ring.init(Tr::kConsumerWarps);
    v_ring.init(Tr::kConsumerWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them (the last
                    // block-wide barrier: the roles part here, and the producer's idle threads may exit)

  if (wg == 0) {  // ---- the producer warpgroup ---------------------------------------------------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (threadIdx.x == 0) produce<Tr>(sm, &tm_q, &tm_k, &tm_v, w);
    return;
  }

  // ---- the consumer warpgroups: 7a's loop, without the refill ------------------------------------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int warp = threadIdx.x / 32 - 4;  // among the consumer warps: owns tile rows 16 warp .. + 15
  const uint32_t q_rows = ptx::smem_u32(sm.q) + Tr::QTile::offset(64 * (wg - 1), 0);
  ptx::mbar_wait(&sm.q_full, 0);
  float o[kOTiles][4] = {};
  step4::RowSoftmax<kSTiles, kOTiles> softmax;
  warpgroup_loop<Tr>(sm, p, w, warp, q_rows, o, softmax, [](int) {});
  step4::store_o_rows<Tr>(o, softmax, sm.q, &tm_o, w.m0, w.bh, warp, p);
}

}  // namespace fa::step7
