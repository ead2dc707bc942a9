// FlashAttention, step by step — step 7d: persistent blocks (step7_hopper_wgmma/kernel_7d_persistent.cuh)
//
// What it adds over 7c: a block no longer owns one query tile. The grid is one block per SM (the most that
// fit: 384 threads and most of the shared memory), and each block takes query tile after query tile from a
// counter in global memory until none is left. The ring's counters run on from tile to tile.
// The idea (FlashAttention-3 and CUTLASS's persistent kernels): in 7a-7c every query tile pays a prologue
// (the block starts, its barriers are made, Q and the first K/V tiles travel from memory while the tensor
// cores wait) and an epilogue (O leaves while they wait again). A tile of 128 rows at N = 1024 is only 8 K/V
// tiles of work, so those waits are a large share of it. A resident block hides them: its producer loads the
// next tile's Q and K/V while the consumers still compute and store the current tile, so the consumers go
// from one tile's last product to the next tile's first almost at once. What makes that safe:
//  - two Q tiles, used alternately (tile k of the block in Q tile k % 2): the next tile's Q lands in the other
//    one. Each is also where its tile's O is staged (as in 7c), and it is released (q_empty) once every
//    consumer warp's O has left it; the producer waits for that before it loads the tile after next there;
//  - the phases: the ring's slot and parity come from a use count that runs over all tiles of the block
//    (TileSlots::first_use, produce_tile); Q tile i's barriers complete once per use (parity = (k / 2) % 2 for
//    the block's tile k);
//  - which tile is next: the producer thread takes it (atomicAdd on TileCounter::next, one tile ahead so the
//    atomic's trip hides behind the current tile's loads) and hands it to the consumers through a slot of
//    shared memory (PersistentSmem::tile, two slots used alternately like the Q tiles) and two mbarriers per
//    slot: tile_full (the producer arrives once it has written the index) and tile_empty (each consumer thread
//    arrives once it has read it; the producer waits for that before it writes the slot again). "No tile
//    left" is an index past the end;
//  - each warpgroup goes on to its next tile on its own: warpgroup 0, a turn ahead, starts the next tile's
//    products while warpgroup 1 still finishes and stores this one, and the turns (7c) run on across tiles.
//    A hand-over that made all consumers meet (one named barrier over both warpgroups) restarted the
//    ping-pong at every tile.
// Why a counter and not a fixed stride (block b visiting tiles b, b + grid, ...): with a causal mask tiles
// differ in length, and a fixed stride hands some blocks only long tiles. With the counter a block that
// finishes early takes the next tile, and as tiles are handed out in step 4's order (a head's query tiles
// next to each other, longest first when causal: scheduler.cuh) the ~132 tiles in flight belong to a few
// heads, whose K/V stay in L2.
// The counter must read 0 at each launch: it is zeroed once when the launch is prepared, and the last block
// to find no tile left puts it back to 0 (step 4f's arrival counters do the same).
// Limits: as 7a.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "step7_hopper_wgmma/kernel_7c_pingpong.cuh"

namespace fa::step7 {

// In global memory, 0 at each launch: tiles handed out beyond the first gridDim.x, and blocks that found no
// tile left (the last of them resets both).
struct TileCounter {
  int next, done;
};

// 7b's producer loop for the block's k-th query tile: Q into Q tile i, K and V through the ring, whose use
// count (`first_use`: the K/V tiles it carried for the block's earlier tiles) runs on from tile to tile.
template <class Tr, class S>
__device__ __forceinline__ void produce_tile(S& sm, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                             const CUtensorMap* tm_v, const step4::QueryTileWork& w, int i, int first_use) {
  constexpr int Bc = Tr::Bc, kStages = Tr::kStages;
  const step4::TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  step4::tma_load_tile<typename Tr::QTile>(sm.q[i], tm_q, w.m0, w.bh, &sm.q_full[i]);
  for (int n = 0; n < w.n_tiles; ++n) {
    const int u = first_use + n, s = k_ring.slot(u);  // the ring's u-th use
    if (u >= kStages) ptx::mbar_wait(&sm.k_empty[s], k_ring.parity(u - kStages));  // use u - kStages released
    k_ring.template load<typename Tr::KVTile>(u, sm.k[0], tm_k, n * Bc, w.bh_kv);
    if (u >= kStages) ptx::mbar_wait(&sm.v_empty[s], v_ring.parity(u - kStages));
    v_ring.template load<typename Tr::KVTile>(u, sm.v[0], tm_v, n * Bc, w.bh_kv);
  }
}

// grid = min(tiles, SMs) blocks, block = 384 threads (producer + two consumer warpgroups).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    forward_7d(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const AttnParams p,
               TileCounter* counter) {
  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);  // warp-uniform, as in 7c (see there)
  const int num_tiles = (p.Nq + Tr::Br - 1) / Tr::Br * p.Hq * p.B;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) {
      ptx::mbar_init(&sm.q_full[i], 1);
      ptx::mbar_init(&sm.q_empty[i], Tr::kConsumerWarps);
      ptx::mbar_init(&sm.tile_full[i], 1);
      ptx::mbar_init(&sm.tile_empty[i], 32 * Tr::kConsumerWarps);
    }
    step4::TmaRing<Tr::kStages>{sm.k_full, sm.k_empty}.init(Tr::kConsumerWarps);
    step4::TmaRing<Tr::kStages>{sm.v_full, sm.v_empty}.init(Tr::kConsumerWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before anyone waits on them (the last block-wide barrier)

  if (wg == 0) {  // ---- the producer: 7b's, tile after tile, in one thread --------------------------------
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (threadIdx.x != 0) return;
    int it = 0;  // K/V tiles the ring carried so far
    for (int tile = blockIdx.x, k = 0;; ++k) {  // the block's k-th tile: Q tile and index slot i = k % 2
      const int i = k % 2;
      if (k >= 2) ptx::mbar_wait(&sm.tile_empty[i], uint32_t(k / 2 - 1) & 1);  // every consumer read index k - 2
      sm.tile[i] = tile;
      ptx::mbar_arrive(&sm.tile_full[i]);  // a release: the index is seen by whoever waits for this phase
      if (tile >= num_tiles) break;
      const int next = int(gridDim.x) + atomicAdd(&counter->next, 1);  // used after this tile's loads
      if (k >= 2) ptx::mbar_wait(&sm.q_empty[i], uint32_t(k / 2 - 1) & 1);  // tile k - 2's O has left Q tile i
      const step4::QueryTileWork w(p, step4::CausalMask(p), Tr::Br, Tr::Bc, unsigned(tile));
      produce_tile<Tr>(sm, &tm_q, &tm_k, &tm_v, w, i, it);
      it += w.n_tiles;
      tile = next;
    }
    __threadfence();  // this block's last atomicAdd on `next` is done before it counts itself out
    if (atomicAdd(&counter->done, 1) == int(gridDim.x) - 1) {  // every block has taken its last tile
      counter->next = 0;
      counter->done = 0;
    }
    return;
  }

  // ---- the consumers: 7c's loop body, tile after tile, each warpgroup at its own pace ----------------------
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const BlockTurns<Tr> turns{wg - 1};
  turns.open();
  for (int it = 0, k = 0;; ++k) {
    const int i = k % 2;
    ptx::mbar_wait(&sm.tile_full[i], uint32_t(k / 2) & 1);  // the producer has written index k
    const int tile = __shfl_sync(0xffffffffu, sm.tile[i], 0);  // lane 0's read for all: warp-uniform, as wg
    ptx::mbar_arrive(&sm.tile_empty[i]);  // every thread: an arrive releases the arriving thread's own read
    if (tile >= num_tiles) break;
    const TileSlots<typename Tr::T> at{sm.q[i], &sm.q_full[i], uint32_t(k / 2) & 1, it};
    const step4::QueryTileWork w(p, step4::CausalMask(p), Tr::Br, Tr::Bc, unsigned(tile));
    run_consumer<Tr>(sm, &tm_o, p, w, at, wg);
    __syncwarp();  // this warp's rows of O have left Q tile i (lane 0 waited for the store to read them) ...
    if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&sm.q_empty[i]);  // ... so the producer may load tile k + 2's Q there
    it += w.n_tiles;
  }
  turns.close();
}

}  // namespace fa::step7
