// FlashAttention, step by step — step 4: the TMA ring (step4_fused_pipelined/ring.cuh)
//
// What it adds: loads that run ahead of the math. A ring of kStages shared-memory slots; tile n of a stream
// lives in slot n % kStages. Each slot has two mbarriers (PTX ISA, "mbarrier"):
//   full[s]   one arrival (the producer's arrive.expect_tx) plus the bytes TMA delivers: the tile landed;
//   empty[s]  one arrival per consumer warp: every warp is done reading the slot.
// A slot's barriers complete once per use, so use n of slot n % kStages waits for phase parity
// (n / kStages) % 2. One thread, the producer, issues every copy: the first kStages tiles up front, then
// in iteration n (n >= 1) tile n + kStages - 1 into the slot of tile n - 1, once every warp released it.
// Step 4 keeps one ring for K and one for V (K is released after S = Q K^T, V after O += P V); step 5 runs
// the same ring over Q and dO tiles, and over K and V in its dQ kernel.
#pragma once
#include <cstdint>

#include "gpu/ptx.h"
#include "step4_fused_pipelined/panel_tile.h"

namespace fa::step4 {

// The copies of one swizzled tile (Tile: a PanelTile, panel_tile.h) into `dst`: one per panel, from a tensor
// map whose box is [Tile::kRows, 64], at tensor row `row` of head `bh`, each signalling `bar`. The caller
// has made `bar` expect their bytes (Tile::kBytes); a barrier may wait for several tiles at once (step 5's
// K and V).
template <class Tile>
__device__ __forceinline__ void tma_load_panels(void* dst, const void* tmap, int row, int bh, uint64_t* bar) {
#pragma unroll
  for (int c = 0; c < Tile::kPanels; ++c)
    ptx::tma_load_3d(static_cast<uint8_t*>(dst) + Tile::panel(c), tmap, c * Tile::kPanelCols, row, bh, bar);
}
// A tile in a buffer of its own (Q): its copies, signalling `bar`, which the calling thread arrives on,
// expecting their bytes. TmaRing::load is this, into a slot.
template <class Tile>
__device__ __forceinline__ void tma_load_tile(void* dst, const void* tmap, int row, int bh, uint64_t* bar) {
  ptx::mbar_arrive_expect_tx(bar, uint32_t(Tile::kBytes));
  tma_load_panels<Tile>(dst, tmap, row, bh, bar);
}

template <int kStages>
struct TmaRing {
  uint64_t* full;   // [kStages]
  uint64_t* empty;  // [kStages]

  __device__ static int slot(int n) { return n % kStages; }
  __device__ static uint32_t parity(int n) { return uint32_t(n / kStages) & 1; }

  // One thread, before the block's first __syncthreads: `consumers` warps release each slot.
  __device__ void init(uint32_t consumers) const {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], consumers);
    }
  }
  // The producer, before the copies of tile n: the slot's full barrier expects `bytes`; returns it, the
  // barrier the copies signal.
  __device__ uint64_t* expect(int n, uint32_t bytes) const {
    uint64_t* bar = &full[slot(n)];
    ptx::mbar_arrive_expect_tx(bar, bytes);
    return bar;
  }
  // The producer: tile n (a Tile, panel_tile.h) of a tensor map whose box is [Tile::kRows, 64] (one
  // 128-byte-wide panel) into its slot of `ring` ([kStages] tiles of Tile::kBytes): a copy per panel at
  // tensor row `row` of head `bh`, all signalling the slot's full barrier, which expects their bytes.
  template <class Tile>
  __device__ void load(int n, void* ring, const void* tmap, int row, int bh) const {
    tma_load_tile<Tile>(static_cast<uint8_t*>(ring) + slot(n) * int(Tile::kBytes), tmap, row, bh, &full[slot(n)]);
  }
  // The producer, in iteration n of n_total: load(n + kStages - 1) into the slot tile n - 1 used, once
  // every warp released it. load(m) issues tile m's copies (after expect(m, ...)).
  template <class Load>
  __device__ void refill(int n, int n_total, Load&& load) const {
    if (threadIdx.x == 0 && n >= 1 && n + kStages - 1 < n_total) {
      ptx::mbar_wait(&empty[slot(n - 1)], parity(n - 1));
      load(n + kStages - 1);
    }
  }
  // A consumer: wait until tile n has landed.
  __device__ void wait(int n) const { ptx::mbar_wait(&full[slot(n)], parity(n)); }
  // A consumer warp is done reading tile n: every lane's ldmatrix reads of the slot are done (__syncwarp)
  // before one lane arrives for the warp.
  __device__ void release(int n) const {
    __syncwarp();
    if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&empty[slot(n)]);
  }
};

}  // namespace fa::step4
