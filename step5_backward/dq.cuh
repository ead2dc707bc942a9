// FlashAttention, step by step — step 5: the dQ kernel (step5_backward/dq.cuh)
//
// What it adds over step 4: nothing new in the machinery; the forward's loop with a different body. A
// block owns Br query rows of one query head (step 4's scheduler), keeps Q and dO in registers, and streams
// the K/V tiles the rows see through step 4's TMA ring, K and V in one slot. It recomputes S and P (the price of owning dQ without atomics: the dK/dV
// kernel computed them too), then
//   P_ij  = exp(scale S_ij - LSE_i)          masked entries 0
//   dP    = (dO V^T) o Z                     [Br, Bc]  (Z: the dropout multiplier, 0 or 1/(1-p))
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ   += dS K                             [Br, d], times scale at the end
// (FlashAttention-2, Algorithm 2, the S, P, dP, dS and dQ lines of its inner loop, for one query tile.)
// The mask is a type (step 4's mask.h): with 4e's score modifiers S passes through the modifier and mask, dS is
// multiplied by the softcap's derivative, and K/V tiles a sliding window hides are skipped (the trip count).
// Limits: d = 64 or 128, bf16/fp16; dQ stored straight from registers.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "step4_fused_pipelined/dropout.cuh"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step4_fused_pipelined/scheduler.cuh"
#include "step5_backward/device.cuh"
#include "step5_backward/traits.h"

namespace fa::step5 {

// grid = ceil(Nq / Br) * Hq * B, block = 32 * Warps threads, dynamic shared memory DqSmem<Tr>::kBytes().
// Rows: where a sequence's rows live (packed_rows.h: DenseRows, or a packed batch's PackedRows).
template <class Tr, bool kDropout, class Mask = step4::CausalMask, class Rows = DenseRows>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
              const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v, const BwdParams bp,
              const Rows rows) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  constexpr int kSTiles = Bc / 8;  // n8 tiles of S and dP (key columns)
  constexpr int kDTiles = D / 8;   // n8 tiles of dQ (head-dim columns)
  const AttnParams& p = bp.a;

  FA_KERNEL_NEEDS_SMEM(DqSmem<Tr>::kBytes());  // more than this GPU's blocks may have: a trap (gpu/gpu_types.h)
  extern __shared__ uint8_t smem_raw[];
  DqSmem<Tr>& sm = *reinterpret_cast<DqSmem<Tr>*>(step4::align_1024(smem_raw));
  const step4::TmaRing<kStages> ring{sm.full, sm.empty};  // the K/V ring

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // The block's sequence as a problem of its own (a packed batch's; the dense batch is p itself), its mask.
  const int b_block = int(blockIdx.x / unsigned((p.Nq + Br - 1) / Br)) / p.Hq;  // QueryTileWork's b
  const auto& seq = rows.keys(p, b_block);
  const Mask mask(seq);                              // which keys each row sees (step 4's mask.h)
  const step4::QueryTileWork w(p, mask, Br, Bc, blockIdx.x);  // step 4's schedule
  const int b = w.b, h = w.h, bh = w.bh, m0 = w.m0;
  if (rows.past_end(m0, seq)) return;  // a packed batch's tile past its sequence's last query: no work
  // The K/V tiles the tile's rows of Q see: w's, but up to the sequence's last row (a packed batch's tile may
  // end past it; in the dense batch this is w's own range).
  const TileRange keys = mask.key_tiles(m0, min(m0 + Br, seq.Nq) - 1, Bc);
  const int n_begin = keys.begin, n_tiles = keys.count();

  // One thread issues every TMA copy: K and V tile n (from the first tile the rows see) into its slot of the ring.
  auto load_k_v = [&](int n) {
    uint64_t* bar = ring.expect(n, 2 * Tr::kKVBytes);  // K and V: one barrier for both tiles
    const step4::KvTileAt at = rows.tile(b, w.bh_kv, (n_begin + n) * Bc);  // or its packed place
    tma_load_pair<typename Tr::KVTile>(sm.k[ring.slot(n)], &tm_k, sm.v[ring.slot(n)], &tm_v, at.row, at.bh, bar);
  };

  // ---- prologue: barriers, then Q, dO and the first kStages K/V tiles in flight ------------------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    ring.init(Tr::kWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(&sm.q_full, 2 * Tr::kQBytes);  // Q and dO: one barrier for both tiles
    const step4::KvTileAt at = rows.q_tile(b, bh, m0);  // (row m0, head bh), or its packed place
    tma_load_pair<typename Tr::QTile>(sm.q, &tm_q, sm.dout, &tm_do, at.row, at.bh, &sm.q_full);
    for (int n = 0; n < kStages && n < n_tiles; ++n) load_k_v(n);
  }

  // Q and dO: shared -> registers, once; warp w holds rows 16w .. 16w+15 as A fragments of every k16 step.
  ptx::mbar_wait(&sm.q_full, 0);
  uint32_t qa[D / 16][4], doa[D / 16][4];
  const uint32_t q_base = ptx::smem_u32(sm.q), do_base = ptx::smem_u32(sm.dout);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    load_a<Br>(qa[kk], q_base, 16 * warp, kk);
    load_a<Br>(doa[kk], do_base, 16 * warp, kk);
  }

  // LSE (in log2 units) and D of this thread's rows g and g + 8; past Nq, LSE = +inf: P = 0.
  const int row_g = m0 + 16 * warp + g;
  float lse2[2], d_i[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in_q = row_g + 8 * r < seq.Nq;
    const int64_t at = rows.lse_at(b, bh, int64_t(bh) * p.Nq + row_g + 8 * r, row_g + 8 * r);  // of LSE and D
    lse2[r] = in_q ? p.lse[at] * kLog2e : INFINITY;  // past Q: P = 0 (device.cuh)
    d_i[r] = in_q ? bp.dsum[at] : 0.0f;
  }

  // This thread's rows g and g + 8 as the mask sees them, and the block's rows for its tile test.
  const typename Mask::Row r_g = mask.row(b, h, row_g), r_g8 = mask.row(b, h, row_g + 8);
  const typename Mask::Span block_rows = mask.span(m0, m0 + Br - 1);

  float dq[kDTiles][4] = {};  // rows g, g+8 of the warp; columns 8nd + 2t, +1
  for (int n = 0; n < n_tiles; ++n) {
    const uint32_t k_base = ptx::smem_u32(sm.k[ring.slot(n)]);
    const uint32_t v_base = ptx::smem_u32(sm.v[ring.slot(n)]);

    // S = Q K^T and dPd = dO V^T: [16 rows, Bc keys] per warp; B = K (V) rows, k = head dim (step 4's S).
    float s[kSTiles][4] = {}, dp[kSTiles][4] = {};
    ring.wait(n);  // K and V tile n have landed
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4], vb[4];
        load_b<Bc>(kb, k_base, np * 16, kk);
        step4::mma_two_n8<T>(s, np, qa[kk], kb);
        load_b<Bc>(vb, v_base, np * 16, kk);
        step4::mma_two_n8<T>(dp, np, doa[kk], vb);
      }
    ring.refill(n, n_tiles, load_k_v);  // after this warp's first products: the other warps are likely done with n - 1

    // Dropout's keep mask of this tile (step 4's DropoutMask: one Philox call per pair of threads).
    step4::DropoutMask keep{};
    const int key0 = (n_begin + n) * Bc;  // the tile's first key
    if constexpr (kDropout) keep = step4::DropoutMask::draw<kSTiles>(p.dropout, b, h, row_g, key0 + 2 * t);

    // Element-wise, on the C fragments: s[nt][e] is row row_g + 8 (e / 2), key key0 + 8nt + 2t + e % 2.
    // s becomes dS (device.cuh, p_and_ds). Only a tile the mask crosses pays for the element test (kTest).
    auto elementwise = [&](auto test) {
      constexpr bool kTest = decltype(test)::value;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j0 = key0 + nt * 8 + 2 * t;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = 2 * r + c;
            const float z = kDropout ? keep.z(nt, e, p.dropout.keep_scale) : 1.0f;
            const Prob pr = probability<kTest>(mask, s[nt][e], r ? r_g8 : r_g, j0 + c, lse2[r], p.scale_log2);
            s[nt][e] = p_and_ds(pr, dp[nt][e], z, d_i[r]).ds;
          }
        }
    };
    if (mask.needs(block_rows, key0, Bc)) elementwise(std::true_type{});
    else elementwise(std::false_type{});

    // dQ += dS K: A = dS repacked (k = key), B = K rows with k = key, read with ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t dsa[4];
      acc_to_a<T>(dsa, s, kk);
#pragma unroll
      for (int np = 0; np < kDTiles / 2; ++np) {
        uint32_t kb[4];
        load_b_trans<Bc>(kb, k_base, kk, np * 16);
        step4::mma_two_n8<T>(dq, np, dsa, kb);
      }
    }
    ring.release(n);  // this warp is done with K and V tile n
  }

  // ---- epilogue: every row of the tile below Nq written once (zeros for a row that sees no key) ---------
  const RowsAt out = rows.q_rows(p, b, bh, D);  // the rows of (b, head) in dQ
  store_rows<T, D>(static_cast<T*>(bp.dq) + out.first, dq, m0 + 16 * warp, seq.Nq, p.scale, 0, out.stride);
}

}  // namespace fa::step5
