// FlashAttention, step by step — step 7e: a packed batch in 7c's kernel (step7_hopper_wgmma/kernel_7e_packed.cuh)
//
// What it adds over 7c: a packed batch of ragged sequences (core/varlen.h, flash_attn_varlen_func's layout) in
// one launch, read through step 4g's PackedBatch (step4_fused_pipelined/packed_batch.h) as 4g reads it:
//   Q, O [total_q, Hq, d], K, V [total_k, Hkv, d], LSE [Hq, total_q]; sequence b is tokens cu_q[b] ..
//   cu_q[b+1] - 1 of Q (cu_k[b] .. of K): its own problem of Nq_b queries and Nk_b keys, causal bottom-right.
// The grid is 7c's for a dense batch of the longest sequence; a tile past its sequence's end exits before it
// touches a barrier; the trip count is 4g's (the mask's, on the sequence's own problem: the tiles 4g's test
// counts against brute force, tests/test_gpu_varlen.cpp); the rest run 7c's producer and ping-pong consumers unchanged on the sequence's problem
// (kv.keys: Nq_b, Nk_b, its diagonal), with the tensor maps seeing Q, K and V as [H, total, d] and the tiles'
// coordinates from kv (a box may run past the sequence into the next one's rows: those queries are never
// stored, those keys are masked as a dense tail is, and past the last token TMA reads zeros).
// What changes is the epilogue: 7c stores each warp's 16 rows of O as one TMA box, which would overwrite the
// next sequence's first rows where a tile is cut short, so O and the LSE leave row by row (store_o_packed), as
// 4f's split kernel stores them.
// Limits: 7c's tiles only (the default 128 x 128, both head dims), no score modifiers (step 7 takes none), no
// dropout. The backward over the same offsets is step 5's (step5_backward/packed_rows.h).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "step4_fused_pipelined/packed_batch.h"
#include "step7_hopper_wgmma/kernel_7c_pingpong.cuh"

namespace fa::step7 {

// Rows g and g + 8 of this warp's 16, normalised by l, each to its place in O; the LSE from lane t == 0.
// Rows past the sequence's last query are the tile's padding: not stored.
template <class Tr, int kOTiles, class Softmax, class Kv>
__device__ __forceinline__ void store_o_packed(float (&o)[kOTiles][4], Softmax& softmax, const step4::QueryTileWork& w,
                                               int warp, const AttnParams& seq, const Kv& kv) {
  using T = typename Tr::T;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float inv_l[2], lse[2];
  softmax.finish(inv_l, lse, seq.scale_log2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = w.m0 + 16 * warp + g + 8 * r;
    if (row >= seq.Nq) continue;
    T* o_out = static_cast<T*>(seq.o) + kv.o_row(w.b, w.bh, 0, row) * Tr::D;
#pragma unroll
    for (int nd = 0; nd < kOTiles; ++nd)
      *reinterpret_cast<uint32_t*>(o_out + nd * 8 + 2 * t) = ptx::pack2<T>(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
    if (seq.lse && t == 0) seq.lse[kv.lse_at(w.b, w.bh, 0, row)] = lse[r];
  }
}

// grid = ceil(max_seqlen_q / Br) * Hq * B blocks (B sequences), block = 7c's (producer + consumer warpgroups).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kBlocksPerSM)
    forward_7e(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const AttnParams p, const step4::PackedBatch kv) {
  static_assert(Tr::kDesign == Design::kPingPong, "7e runs 7c's kernel");
  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  // The tile's place in the grid (sequence w.b, head, first row m0), then its trip count on its own sequence.
  step4::QueryTileWork w(p, step4::CausalMask(p), Tr::Br, Tr::Bc, blockIdx.x);
  const AttnParams seq = kv.keys(p, w.b);  // Nq_b, Nk_b, input_pos_b = Nk_b - Nq_b
  if (kv.past_end(w.m0, seq)) return;     // the whole block, before any barrier: no work past the sequence
  const TileRange keys = step4::CausalMask(seq).key_tiles(w.m0, min(w.m0 + Tr::Br, seq.Nq) - 1, Tr::Bc);
  w.n_begin = keys.begin;
  w.n_tiles = keys.count();
  run_block<Tr>(sm, &tm_q, &tm_k, &tm_v, /*tm_o=*/nullptr, seq, w, wg, kv);  // 7c's block, at the packed places
}

}  // namespace fa::step7
