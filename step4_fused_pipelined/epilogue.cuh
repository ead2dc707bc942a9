// FlashAttention, step by step — step 4: the forward's epilogue (step4_fused_pipelined/epilogue.cuh)
//
// What it adds: how a warp's finished rows leave the kernel. After the last K/V tile each warp owns 16 rows
// of O in its accumulators (rows g and g + 8 of every n8 block, fragments.cuh) and the row statistics in
// its RowSoftmax (softmax.h). It normalises O by l, packs it to 16 bits, stages it over its own 16 rows of
// the Q tile in shared memory (only this warp read them, so no other warp must be waited for), and one lane
// stores them with TMA; the LSE goes straight from registers. 4d writes it; step 7's kernels, whose warps
// hold the same fragments, call it too.
#pragma once
#include <cuda.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/fragments.cuh"

namespace fa::step4 {

// warp: the warp's index among the block's computing warps (it owns tile rows 16 warp .. 16 warp + 15);
// sq: the [kPanels][Br, 64] Q tile; m0, bh: the tile's first query row and its (batch, head).
template <class Tr, int kOTiles, class Softmax>
__device__ __forceinline__ void store_o_rows(float (&o)[kOTiles][4], Softmax& softmax, typename Tr::T* sq,
                                             const CUtensorMap* tm_o, int m0, int bh, int warp, const AttnParams& p) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row_g = m0 + 16 * warp + g;
  float inv_l[2], lse[2];
  softmax.finish(inv_l, lse, p.scale_log2);
  uint8_t* sO = reinterpret_cast<uint8_t*>(sq);  // the warp alone read these 16 rows of Q: safe to reuse,
  __syncwarp();  // ... once every lane's reads of them are done (a tile with no K/V trip has no other sync)
#pragma unroll
  for (int nd = 0; nd < kOTiles; ++nd)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t off = Tr::QTile::offset(16 * warp + g + 8 * r, nd * 8) + 4 * t;  // columns 8nd + 2t, +1
      *reinterpret_cast<uint32_t*>(sO + off) =
          ptx::pack2<typename Tr::T>(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
    }
  ptx::fence_async_shared();  // the TMA store (async proxy) must see these ordinary stores
  __syncwarp();               // ... from every lane of the warp
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < Tr::kPanels; ++c)  // the warp's 16 rows of each panel: a [16, 64] box
      ptx::tma_store_3d(tm_o, c * 64, m0 + 16 * warp, bh, sO + Tr::QTile::offset(16 * warp, 64 * c));
    ptx::tma_store_commit_and_wait();  // shared memory must outlive the store's reads
  }
  if (p.lse && t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_g + 8 * r < p.Nq) p.lse[int64_t(bh) * p.Nq + row_g + 8 * r] = lse[r];
}

}  // namespace fa::step4
