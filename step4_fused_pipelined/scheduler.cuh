// FlashAttention, step by step — step 4: which query tile a block owns (step4_fused_pipelined/scheduler.cuh)
//
// grid = ceil(Nq / Br) * Hq * B blocks, one per query tile of one head. The query tiles of one head are
// neighbours in the grid, so they run side by side and share that head's K/V through L2. With a causal
// mask the rows of the last tiles see the most keys (bottom-right alignment), so the tile order is
// reversed: the longest blocks start first and the short ones fill the tail. A block visits the K/V tiles
// its rows see: all of K, or (causal) up to the diagonal of its last row. Step 5's dQ kernel walks the
// same schedule. The ablation TileOrder::kHeadFast makes the head the fast index instead: the blocks in
// flight then read as many different heads' K/V as there are blocks (docs/history/step4.md#ablation-the-head-as-the-fast-index).
// Which K/V tiles those are is the mask's trip count (mask.h, key_tiles): with 4e's sliding window a block
// visits only the tiles some row of it sees, from the first row's left edge to the last row's right edge
// (n_begin > 0). The arithmetic is core/tile_range.h's, which the host tests check against brute force.
#pragma once
#include <cstdint>

#include "gpu/attn_params.h"
#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step4 {

struct QueryTileWork {
  int b, h, bh, bh_kv;  // batch, query head, their flat index, the flat index of its KV head (GQA)
  int m0;               // first query row of the tile
  int n_begin = 0;      // the first K/V tile the tile's rows see (0 unless a window cuts the left)
  int n_tiles;          // K/V tiles of Bc keys the tile's rows see, from n_begin on

  // tile: the query tile's index in the grid's order (a block's blockIdx.x); mask: the kernel's mask type
  // (mask.h), whose trip count says which K/V tiles.
  template <class Mask>
  __device__ QueryTileWork(const AttnParams& p, const Mask& mask, int Br, int Bc, unsigned tile,
                           TileOrder order = TileOrder::kTileFast) {
    const unsigned idx = tile;  // unsigned, as blockIdx.x: u32 division
    const int num_m = (p.Nq + Br - 1) / Br;
    int m_block = idx % num_m;
    bh = idx / num_m;
    if (order == TileOrder::kHeadFast) {
      m_block = idx / (p.B * p.Hq);
      bh = idx % (p.B * p.Hq);
    }
    if (p.causal) m_block = num_m - 1 - m_block;
    h = bh % p.Hq;
    b = bh / p.Hq;
    bh_kv = b * p.Hkv + h / p.group;
    m0 = m_block * Br;
    const TileRange keys = mask.key_tiles(m0, min(m0 + Br, p.Nq) - 1, Bc);  // the K/V tiles rows m0 .. last see
    n_begin = keys.begin;
    n_tiles = keys.count();
  }
};

}  // namespace fa::step4
