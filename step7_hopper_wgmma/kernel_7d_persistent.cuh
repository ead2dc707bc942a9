// FlashAttention, step by step — step 7d: persistent blocks (step7_hopper_wgmma/kernel_7d_persistent.cuh)
//
// What it adds over 7c: a block no longer owns one query tile. The grid is one block per SM (the most that
// fit: 384 threads and most of the shared memory), and block b visits tiles b, b + grid, b + 2 grid, ...
// (step 4's scheduler, scheduler.cuh, names each one). The ring's counters run on from tile to tile.
// The idea (FlashAttention-3 and CUTLASS's persistent kernels): in 7a-7c every query tile pays a prologue
// (the block starts, its barriers are made, Q and the first K/V tiles travel from memory while the tensor
// cores wait) and an epilogue (O leaves while they wait again). A tile of 128 rows at N = 1024 is only 8 K/V
// tiles of work, so those waits are a large share of it. A resident block hides them: its producer loads the
// next tile's Q and K/V while the consumers still finish and store the current tile, so the consumers go from
// one tile's last product to the next tile's first almost at once. Two additions make that safe:
//  - the Q tile is released (q_empty: every consumer warp arrives once its last product is done) and refilled
//    while O is stored, so O is staged in a tile of its own (PersistentSmem, kernel_traits.h);
//  - the phases: the ring's slot and parity come from a use count that runs over all tiles of the block
//    (TileSlots::it0), and q_full completes once per tile (parity = tile count % 2).
// The consumers' loop body is 7c's (consume_pingpong), the producer's 7b's (produce), per tile.
// The order of the tiles matters here, as the hardware no longer hands a free SM the next block: with a causal
// mask, tile lengths differ, and a block that strides through step 4's order (the query tiles of one head
// next to each other) can land on long tiles only, if its stride and the tiles per head share a factor. So a
// causal problem takes the tiles longest first over all heads (step 4's head-fast order, TileOrder::kHeadFast,
// reversed for causal): every round of blocks takes tiles of about one length. Without a mask every tile has
// the same length and the head's tiles stay neighbours (they share its K/V in L2).
// Limits: as 7a; the order is static (a block does not ask for the next free tile: FlashAttention-3's causal
// scheduler does, with an atomic counter).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "step7_hopper_wgmma/kernel_7c_pingpong.cuh"

namespace fa::step7 {

// grid = min(tiles, SMs) blocks, block = 384 threads (producer + two consumer warpgroups).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    forward_7d(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const AttnParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  const int wg = threadIdx.x / 128;
  const int num_tiles = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  const step4::TileOrder order = p.causal ? step4::TileOrder::kHeadFast : step4::TileOrder::kTileFast;  // see above
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    ptx::mbar_init(&sm.q_empty, Tr::kConsumerWarps);
    step4::TmaRing<Tr::kStages>{sm.k_full, sm.k_empty}.init(Tr::kConsumerWarps);
    step4::TmaRing<Tr::kStages>{sm.v_full, sm.v_empty}.init(Tr::kConsumerWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before anyone waits on them (the last block-wide barrier)

  if (wg == 0) {  // ---- the producer: 7b's, tile after tile ----------------------------------------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0, local = 0;  // K/V tiles loaded so far, query tiles visited so far
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, ++local) {
      const step4::QueryTileWork w(p, Tr::Br, Tr::Bc, order, nullptr, tile);
      if (local > 0) ptx::mbar_wait(&sm.q_empty, uint32_t(local - 1) & 1);  // the last tile's products are done with Q
      produce<Tr>(sm, &tm_q, &tm_k, &tm_v, w, it);
      it += w.n_tiles;
    }
    return;
  }

  // ---- the consumers: 7c's loop body, tile after tile ------------------------------------------------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  int it = 0, local = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, ++local) {
    const step4::QueryTileWork w(p, Tr::Br, Tr::Bc, order, nullptr, tile);
    const TileSlots at{it, uint32_t(local) & 1, &sm.q_empty};
    if (wg == 1) consume_pingpong<Tr, 0>(sm, &tm_o, p, w, sm.o, at);
    else consume_pingpong<Tr, 1>(sm, &tm_o, p, w, sm.o, at);
    it += w.n_tiles;
  }
}

}  // namespace fa::step7
