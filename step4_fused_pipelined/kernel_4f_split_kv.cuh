// FlashAttention, step by step — step 4f: split-KV for decoding (step4_fused_pipelined/kernel_4f_split_kv.cuh)
//
// What it adds over 4d (kernel_4d_tma.cuh): decoding, a few new query rows against a long KV cache. 4d gives
// one block to each (query tile, head); with Nq = 1 and B * Hq = 32 that is 32 blocks for 132 SMs, each
// computing a 64-row tile for one real row. Two changes fix both (FlashAttention's flash-decoding):
//  - split-KV: the K/V tiles a block would walk are divided among `splits` blocks (grid.y). Each writes
//    its partial result, O normalised by its own l and its LSE, to a workspace, and combine.cuh merges the
//    splits with step 2's merge of online-softmax states (core/online_softmax.h, merge_states): the same
//    function, on the GPU. A split that sees no key (causal, or past the end) writes the merge's identity,
//    LSE = -inf and O = 0. The combine is launched as a programmatic dependent (prepare.cuh), so its launch
//    overlaps the splits' work; with one split there is nothing to merge, and the kernel writes O itself;
//  - grouped query heads packed (kPacked): the g query heads that share a KV head are consecutive in
//    [B, Hq, Nq, d], so Q and O seen as [B * Hkv, g * Nq, d] put all g * Nq rows of a group in one tile, and
//    each K/V tile is read once per group instead of once per query head. A row r of such a tile is query
//    row r % Nq of head r / Nq of its group: the causal mask uses that position.
// Everything else is 4d's kernel: the TMA ring, the swizzled tiles, mma.sync, the online softmax.
// Equations: split s of a row ends with the state (m_s, l_s, acc_s) of FlashAttention-2, Algorithm 1 over
// its keys; the merge (m, l, acc) (+) (m', l', acc') = (max, e^(m - max) l + e^(m' - max) l', ...) of all
// splits, in any order, is the state over all keys. Stored as (LSE_s, O_s) = (m_s + log l_s, acc_s / l_s),
// which is the state (LSE_s, 1, O_s).
// A warp whose rows all lie past the last row (most of a tile, at decode) skips the math. The mask is a type,
// as in 4d: with 4e's score modifiers a window narrows the tiles the splits divide.
// The KV cache is a type too (paged_kv.h): ContiguousKv, or KvCache, whose sequences hold different numbers
// of keys (the mask and the trip count read sequence b's own problem) and may sit in pages (each tile's TMA
// coordinates through the block table). 4g (packed_batch.h) runs a packed batch of ragged sequences through
// the same kernel: that type also says where a tile's query rows and outputs are, and which tiles of the
// grid lie past their sequence's end (DenseQueries, paged_kv.h, for the dense layout).
// Short tiles (at most kMergeInKernelRows rows, one per warp) skip the combine kernel: each split counts its
// arrival in `arrivals` with a release-acquire atomic, and the last one, seeing every other split's partial
// result in L2, merges the tile's rows with the combine's own merge_row.
// Limits: no dropout with packed heads (a tile's rows would need per-row dropout heads; the launcher packs
// only without dropout); the workspace costs splits x B x Hq x Nq x (d + 1) floats.
#pragma once
#include <cuda.h>
#include <cuda/atomic>
#include <cuda_runtime.h>

#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/combine.cuh"
#include "step4_fused_pipelined/dropout.cuh"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/kernel_traits.h"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/paged_kv.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step4_fused_pipelined/softmax.h"

namespace fa::step4 {

// What a split needs beside the problem.
struct SplitParams {
  AttnParams view;      // p itself, or (packed) p seen as [B * Hkv, g * Nq, d]: Hq = Hkv, Nq = g * Nq, group = 1
  float* o_part;        // [splits, B * Hq * Nq, d]   each split's O, normalised by its own l; nullptr: one
                        //   split, which writes O and the LSE itself (no combine)
  float* lse_part;      // [splits, B * Hq * Nq]      each split's LSE; -inf: the split saw no key
  int64_t rows_total;   // B * Hq * Nq
  int tiles_per_split;  // K/V tiles of Bc keys per split
  int* arrivals;        // [grid.x] splits of each query tile that have finished, zero between launches; nullptr:
                        //   the combine kernel merges (rows of a tile > kMergeInKernelRows, or one split)
};

// A query tile with at most this many rows (decoding one token: g * Nq <= 4) is merged by its last split to
// finish, inside the split kernel, one warp per row: a handful of rows is too little work to pay for a second
// kernel. More rows would queue on the last block's warps (docs/history/step4.md#4e-the-in-kernel-merge-of-short-tiles).
constexpr int kMergeInKernelRows = 4;

// grid = (ceil(view Nq / Br) * view Hq * B, splits), block = 32 * kWarps threads, shared memory kFwdSmemBytes<Tr>.
template <class Tr, bool kDropout, bool kPacked, class Mask = CausalMask, class Kv = ContiguousKv>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    split_kv_forward(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const AttnParams p, const SplitParams sp, const Kv kv) {
  static_assert(!(kDropout && kPacked), "dropout draws per (head, row): packed tiles mix heads");
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
  const QueryTileWork w(sp.view, CausalMask(sp.view), Br, Bc, blockIdx.x);  // which tile of the view (scheduler.cuh); its n_tiles is not used
  const auto& seq = kv.keys(p, w.b);  // the problem as sequence w.b sees it: its keys (paged_kv.h)
  const auto& view = kv.queries(sp.view, w.b);  // the view's rows of sequence w.b: all, but in a packed batch (4g)
  if (kv.past_end(w.m0, view)) return;  // a packed batch's tile past its sequence's last query: no work (packed_batch.h)
  const Mask mask(seq);  // which keys each row sees (mask.h; 4e's ScoreMods), in positions of the problem
  auto pos = [&](int r) { return kPacked ? r % seq.Nq : r; };  // the query row (position - input_pos) of tile row r
  // The K/V tiles the tile's rows see (the mask's trip count, from the earliest row's to the latest row's
  // positions), and this split's share.
  const int last_row = min(w.m0 + Br, view.Nq) - 1;
  const bool spans_heads = kPacked && last_row / seq.Nq != w.m0 / seq.Nq;  // the tile's positions wrap around
  const int last_i = spans_heads ? seq.Nq - 1 : pos(last_row);
  const TileRange all = mask.key_tiles(spans_heads ? 0 : pos(w.m0), last_i, Bc);
  const TileRange share = split_share(all, blockIdx.y, sp.tiles_per_split);
  const int n_begin = share.begin;   // this split's first K/V tile
  const int n_tiles = share.count();
  if (threadIdx.x == 0) kv.count_tiles(n_tiles);  // a packed batch's test counts the tiles walked

  // One thread issues every TMA copy: K (or V) tile n_begin + n into its ring's slot n, from where the cache
  // keeps it (rows of (b, KV head), or a page of the pool: paged_kv.h).
  auto load_k = [&](int n) {
    const KvTileAt at = kv.tile(w.b, w.bh_kv, (n_begin + n) * Bc);
    k_ring.template load<typename Tr::KVTile>(n, sm.k[0], &tm_k, at.row, at.bh);
  };
  auto load_v = [&](int n) {
    const KvTileAt at = kv.tile(w.b, w.bh_kv, (n_begin + n) * Bc);
    v_ring.template load<typename Tr::KVTile>(n, sm.v[0], &tm_v, at.row, at.bh);
  };
  // The producer, in iteration n >= 1: K and V tile n + kStages - 1 into the slots of tile n - 1, which every
  // warp released in its previous iteration (K after its Q K^T, V after its P V). With one slot, at the top of
  // the iteration; with more, K's and V's refills are issued at two places of the loop (below).
  auto refill = [&](int n) {
    k_ring.refill(n, n_tiles, load_k);
    v_ring.refill(n, n_tiles, load_v);
  };

  // ---- prologue: barriers, then Q and the first kStages tiles of K and of V in flight -----------------
  // A decode block is short (a few microseconds), so its first loads leave as early as they can: the tensor
  // maps' fetch starts first, and the thread that initialises the barriers issues the copies before the
  // block's barrier (TMA sees the initialised barriers after fence_barrier_init, in that thread's order).
  if (threadIdx.x == 0) {
    ptx::prefetch_tensormap(&tm_q);
    ptx::prefetch_tensormap(&tm_k);
    ptx::prefetch_tensormap(&tm_v);
    ptx::mbar_init(&sm.q_full, 1);
    k_ring.init(Tr::kWarps);
    v_ring.init(Tr::kWarps);
    ptx::fence_barrier_init();
    const KvTileAt qa = kv.q_tile(w.b, w.bh, w.m0);  // (row w.m0, head w.bh), or its packed place (4g)
    tma_load_tile<typename Tr::QTile>(sm.q, &tm_q, qa.row, qa.bh, &sm.q_full);
    for (int n = 0; n < kStages && n < n_tiles; ++n) {
      load_k(n);
      load_v(n);
    }
  }
  __syncthreads();  // the barriers exist before any other thread waits on them

  // Q: shared -> registers, once. Warp w reads rows 16w .. 16w+15 as A fragments of every k16 step.
  ptx::mbar_wait(&sm.q_full, 0);
  uint32_t q[kQSteps][4];
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) load_a<Br, kL>(q[kk], ptx::smem_u32(sm.q), 16 * warp, kk);

  // ---- main loop over K/V tiles -----------------------------------------------------------------------
  float o[kOTiles][4] = {};  // O accumulators: rows g, g+8; columns nd*8 + 2t, +1
  RowSoftmax<kSTiles, kOTiles> softmax;
  const int row_g = w.m0 + 16 * warp + g;  // tile row (of the view) of this thread's row g
  const int r_warp = w.m0 + 16 * warp;     // the warp's first row; the earliest position among its rows:
  const int i_warp = kPacked && r_warp % seq.Nq + 15 >= seq.Nq ? 0 : pos(r_warp);
  const int i_warp_last = kPacked && r_warp % seq.Nq + 15 >= seq.Nq ? seq.Nq - 1 : min(pos(r_warp + 15), seq.Nq - 1);  // latest
      // position that is a row of Q (the forward leaves rows past the end out of the tile test: nothing stores them)
  // This thread's two rows as the mask sees them (a packed row's head: its group's g-th). A padding row past
  // the view's last row is row Nq of its head, which sees nothing (and never a head past Hq).
  auto mask_row = [&](int r) {
    const bool pad = r >= view.Nq;
    return mask.row(w.b, kPacked ? w.h * p.group + (pad ? 0 : r / seq.Nq) : w.h, pad ? seq.Nq : pos(r));
  };
  const typename Mask::Row r_g = mask_row(row_g), r_g8 = mask_row(row_g + 8);
  const typename Mask::Span warp_rows = mask.span(i_warp, i_warp_last);  // the tile test's rows

  // Decoding leaves warps with no row at all (g * Nq = 4 rows fill a quarter of warp 0): they compute nothing,
  // but still wait for every tile and release it, since the ring counts every warp's release (and waiting for
  // the full barrier keeps their arrivals in the right phase of the empty one).
  const bool idle = r_warp >= view.Nq;

  for (int n = 0; n < n_tiles; ++n) {
    if constexpr (kStages == 1) refill(n);  // one slot: tile n can only be loaded once n-1 is released
    if (idle) {  // never warp 0, whose thread 0 is the producer
      k_ring.wait(n);
      k_ring.release(n);
      v_ring.wait(n);
      v_ring.release(n);
      continue;
    }

    // Dropout's keep mask of this tile depends on positions only: drawn here, where S is not yet live.
    DropoutMask keep{};
    if constexpr (kDropout) keep = DropoutMask::draw<kSTiles>(p.dropout, w.b, w.h, row_g, (n_begin + n) * Bc + 2 * t);

    // S = Q K^T: [16 rows, Bc keys] per warp (fragments.cuh).
    float s[kSTiles][4] = {};
    k_ring.wait(n);  // K tile n has landed
    const uint32_t k_base = ptx::smem_u32(sm.k[k_ring.slot(n)]);
    warp_qk<T, Bc, D, kL>(s, q, k_base);
    k_ring.release(n);

    // The producer refills K after this warp's Q K^T (the other warps are likely done with tile n - 1), V
    // only after its P V below: V's next tile is needed half an iteration after K's, and K's and V's copies
    // then leave apart rather than together, which streams K/V faster at decode
    // (docs/history/step4.md#4e-the-order-of-the-refills-kept-v-after-p-v).
    if constexpr (kStages > 1) k_ring.refill(n, n_tiles, load_k);

    // Mask only where needed: the tail of K, or a tile that crosses the diagonal of this warp's earliest row.
    const int key0 = (n_begin + n) * Bc;
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
    if constexpr (kStages > 1) v_ring.refill(n, n_tiles, load_v);  // V tile n + kStages - 1, slot of n - 1
  }

  // ---- epilogue: this split's partial result, O normalised by its own l and the LSE, to the workspace -----
  // (a split with no key leaves l = 0: O = 0 and LSE = -inf, the identity of the merge in combine.cuh).
  // With one split (no workspace) the partial result is the result: O and the LSE go to their tensors.
  // The combine kernel may be scheduled now (programmatic dependent launch, prepare.cuh): it waits for this
  // whole grid to finish before reading a byte, so starting it early only hides its launch.
  ptx::launch_dependents();
  float inv_l[2], lse[2];
  softmax.finish(inv_l, lse, p.scale_log2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_g + 8 * r;
    if (row >= view.Nq) continue;  // a padding row of the last tile
    // Row `row` of view head w.bh is row w.bh * view Nq + row of [B, Hq, Nq]: the packed view is a reshape.
    // (A packed batch stores it at its own place: packed_batch.h.)
    const int64_t flat = int64_t(w.bh) * sp.view.Nq + row;
    if (sp.o_part == nullptr) {
      T* o_out = static_cast<T*>(p.o) + kv.o_row(w.b, w.bh, flat, row) * D;
#pragma unroll
      for (int nd = 0; nd < kOTiles; ++nd)
        *reinterpret_cast<uint32_t*>(o_out + nd * 8 + 2 * t) = ptx::pack2<T>(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
      if (p.lse && t == 0) p.lse[kv.lse_at(w.b, w.bh, flat, row)] = lse[r];
      continue;
    }
    const int64_t at = int64_t(blockIdx.y) * sp.rows_total + flat;  // split blockIdx.y's copy of the row
    float* o_out = sp.o_part + at * D;
#pragma unroll
    for (int nd = 0; nd < kOTiles; ++nd)
      *reinterpret_cast<float2*>(o_out + nd * 8 + 2 * t) = make_float2(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
    if (t == 0) sp.lse_part[at] = lse[r];
  }

  // ---- a short tile: the last split to finish merges its rows (combine.cuh's merge_row) -----------------
  if (sp.arrivals == nullptr) return;  // one split, or the combine kernel merges
  __syncthreads();  // every thread's partial results are written before thread 0 counts the block's arrival
  bool last = false;
  if (threadIdx.x == 0) {
    // Release and acquire at GPU scope in one atomic: the block's writes (ordered before it by the barrier)
    // are published with the count, and the last split sees every split counted before it.
    cuda::atomic_ref<int, cuda::thread_scope_device> arrived(sp.arrivals[blockIdx.x]);
    last = arrived.fetch_add(1, cuda::memory_order_acq_rel) == int(gridDim.y) - 1;
    if (last) arrived.store(0, cuda::memory_order_relaxed);  // every split has arrived: reset for the next launch
  }
  // A barrier that also hands every thread thread 0's verdict.
  if (!__syncthreads_or(last)) return;
  static_assert(kMergeInKernelRows <= Tr::kWarps, "a short tile's rows are merged one per warp, in one round");
  if (warp < sp.view.Nq - w.m0)  // the tile's real rows (at most kMergeInKernelRows): one warp each
    merge_row<T, D, true>(sp.o_part, sp.lse_part, int(gridDim.y), sp.rows_total,
                          int64_t(w.bh) * sp.view.Nq + w.m0 + warp, lane, static_cast<T*>(p.o), p.lse);
}

}  // namespace fa::step4
