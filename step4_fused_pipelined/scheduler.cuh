// FlashAttention, step by step — step 4: which query tile a block owns (step4_fused_pipelined/scheduler.cuh)
//
// grid = ceil(Nq / Br) * Hq * B blocks, one per query tile of one head. The query tiles of one head are
// neighbours in the grid, so they run side by side and share that head's K/V through L2. With a causal
// mask the rows of the last tiles see the most keys (bottom-right alignment), so the tile order is
// reversed: the longest blocks start first and the short ones fill the tail. A block visits the K/V tiles
// its rows see: all of K, or (causal) up to the diagonal of its last row. Step 5's dQ kernel walks the
// same schedule. The ablation TileOrder::kHeadFast makes the head the fast index instead: the blocks in
// flight then read as many different heads' K/V as there are blocks (docs/results/step4.md, row 14).
#pragma once
#include <cstdint>

#include "gpu/gpu_runner.h"
#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step4 {

struct QueryTileWork {
  int b, h, bh, bh_kv;  // batch, query head, their flat index, the flat index of its KV head (GQA)
  int m0;               // first query row of the tile
  int n_tiles;          // K/V tiles of Bc keys the tile's rows see

  __device__ QueryTileWork(const AttnParams& p, int Br, int Bc, TileOrder order = TileOrder::kTileFast) {
    const int num_m = (p.Nq + Br - 1) / Br;
    int m_block = blockIdx.x % num_m;
    bh = blockIdx.x / num_m;
    if (order == TileOrder::kHeadFast) {
      m_block = blockIdx.x / (p.B * p.Hq);
      bh = blockIdx.x % (p.B * p.Hq);
    }
    if (p.causal) m_block = num_m - 1 - m_block;
    h = bh % p.Hq;
    b = bh / p.Hq;
    bh_kv = b * p.Hkv + h / p.group;
    m0 = m_block * Br;
    const int64_t last_row = min(m0 + Br, p.Nq) - 1;
    const int64_t last_key = p.causal ? min(int64_t(p.Nk) - 1, p.input_pos + last_row) : int64_t(p.Nk) - 1;
    n_tiles = last_key < 0 ? 0 : int(last_key / Bc) + 1;
  }
};

}  // namespace fa::step4
