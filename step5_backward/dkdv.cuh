// FlashAttention, step by step — step 5: the dK/dV kernel (step5_backward/dkdv.cuh)
//
// What it adds over step 4: the same machinery (TMA ring with full/empty mbarriers, swizzled panels,
// mma.sync, accumulators repacked as A fragments) run over the transposed problem. A block owns Bc keys
// of one KV head and streams every query tile that sees them, of every query head of its GQA group, so
// dK and dV stay in registers and are written once, without atomics.
// Paper equations (FlashAttention-2, Algorithm 2, its inner loop, transposed so keys are the rows of every
// product; i: query, j: key; Z: the dropout multiplier, 0 or 1/(1-p)):
//   S^T = K Q^T                               [Bc, Bq]  (the scale is folded into the exp2)
//   P^T_ji = exp(scale S^T_ji - LSE_i)        masked entries 0: exactly the forward's normalised P
//   dV += (P^T o Z^T) dO                      [Bc, d]
//   dP^T = (V dO^T) o Z^T                     [Bc, Bq]
//   dS^T_ji = P^T_ji (dP^T_ji - D_i)
//   dK += dS^T Q                              [Bc, d], times scale at the end
// Per warp every product has the forward's shape: 16 keys play the part of step 4's 16 query rows, and
// P^T and dS^T never leave registers. The price: every warp reads the whole Q and dO tile, twice (the
// kernel is bound by shared-memory bandwidth; atomic.cuh lays its warps out otherwise).
// The mask is a type (step 4's mask.h): with 4e's score modifiers S^T passes through the modifier and mask
// (S', raw units), dS^T is multiplied by the softcap's derivative (dS_pre), which is also dBias (stored when
// there is a bias, device.cuh's DBiasRows); query tiles a sliding window hides are skipped.
// Limits: d = 64 or 128, bf16/fp16; K and V are re-read from shared memory at every step (their A
// fragments would cost 32 to 64 more registers); dK/dV stored straight from registers.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "step4_fused_pipelined/dropout.cuh"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/ring.cuh"
#include "step5_backward/device.cuh"
#include "step5_backward/traits.h"

namespace fa::step5 {

// LSE (log2 units) and D of the query columns col0 + 8nt + 2t + c (c = 0, 1) that a thread's C fragments of
// S^T hold (past Nq: LSE +inf, D 0), for head row offset row_off; loaded before the products, so that their latency
// hides behind them.
template <int NT>
__device__ __forceinline__ void load_lse_d(float (&lse2)[NT][2], float (&d_i)[NT][2], const BwdParams& bp,
                                           int64_t row_off, int col0, int Nq) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = col0 + nt * 8 + 2 * t + c;
      lse2[nt][c] = i < Nq ? bp.a.lse[row_off + i] * kLog2e : INFINITY;  // past Q: P = 0 (device.cuh)
      d_i[nt][c] = i < Nq ? bp.dsum[row_off + i] : 0.0f;
    }
}

// grid = ceil(Nk / Bc) * Hkv * B, block = 32 * Warps threads, dynamic shared memory DkDvSmem<Tr>::kBytes().
// Rows: where a sequence's rows live (packed_rows.h: DenseRows, or a packed batch's PackedRows).
template <class Tr, bool kDropout, class Mask = step4::CausalMask, class Rows = DenseRows>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v, const BwdParams bp,
                const Rows rows) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Bc = Tr::Bc, Bq = Tr::Bq, kStages = Tr::kStages;
  constexpr int kQTiles = Bq / 8;  // n8 tiles of S^T and dP^T (query columns)
  constexpr int kDTiles = D / 8;   // n8 tiles of dK and dV (head-dim columns)
  const AttnParams& p = bp.a;

  FA_KERNEL_NEEDS_SMEM(DkDvSmem<Tr>::kBytes());  // more than this GPU's blocks may have: a trap (gpu/gpu_types.h)
  extern __shared__ uint8_t smem_raw[];
  DkDvSmem<Tr>& sm = *reinterpret_cast<DkDvSmem<Tr>*>(step4::align_1024(smem_raw));
  const step4::TmaRing<kStages> ring{sm.full, sm.empty};  // the Q/dO ring

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // The block's sequence as a problem of its own (a packed batch's; the dense batch is p itself), its mask.
  const int b_block = int(blockIdx.x / unsigned((p.Nk + Bc - 1) / Bc)) / p.Hkv;  // KeyBlockWork's b
  const auto& seq = rows.keys(p, b_block);
  const Mask mask(seq);                              // which keys each query sees (step 4's mask.h)
  const KeyBlockWork w(p, mask, Bc, Bq, /*rotate=*/false);  // which keys, which query tiles (device.cuh)
  const int k0 = w.k0;
  if (rows.keys_past_end(k0, seq)) return;  // a packed batch's block past its sequence's last key: no work
  auto load_q_do_tiles = [&](int it) { load_q_do<Tr>(sm, ring, w, p.Hq, it, &tm_q, &tm_do, rows); };

  // ---- prologue: barriers, then K, V and the first kStages Q/dO tiles in flight ------------------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.kv_full, 1);
    ring.init(Tr::kWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(&sm.kv_full, 2 * Tr::kKVBytes);  // K and V: one barrier for both tiles
    const step4::KvTileAt at = rows.tile(w.b, w.bh_kv, k0);  // (row k0, head w.bh_kv), or its packed place
    tma_load_pair<typename Tr::KVTile>(sm.k, &tm_k, sm.v, &tm_v, at.row, at.bh, &sm.kv_full);
    for (int n = 0; n < kStages && n < w.n_iter; ++n) load_q_do_tiles(n);
  }
  ptx::mbar_wait(&sm.kv_full, 0);  // K and V have landed (read for the whole kernel, never overwritten)

  float dk[kDTiles][4] = {}, dv[kDTiles][4] = {};  // rows: keys g, g+8 of the warp; columns 8nd + 2t, +1
  const int key_g = k0 + 16 * warp + g;           // absolute key of this thread's row g
  const uint32_t k_base = ptx::smem_u32(sm.k), v_base = ptx::smem_u32(sm.v);

  for (int it = 0; it < w.n_iter; ++it) {
    const int h = w.head(it), q0 = w.q0(it);
    const int64_t row_off = rows.lse_at(w.b, w.b * p.Hq + h, (int64_t(w.b) * p.Hq + h) * p.Nq, 0);  // LSE and D of head h
    const uint32_t q_base = ptx::smem_u32(sm.q[ring.slot(it)]), do_base = ptx::smem_u32(sm.dout[ring.slot(it)]);

    float lse2[kQTiles][2], d_i[kQTiles][2];  // of this thread's query columns q0 + 8nt + 2t + c
    load_lse_d(lse2, d_i, bp, row_off, q0, seq.Nq);

    // S^T = K Q^T and dPd^T = V dO^T: [16 keys, Bq queries] per warp. A = this warp's 16 rows of K (V),
    // B = Q (dO) rows with k = head dim: step 4's Q K^T with keys and queries swapped.
    float s[kQTiles][4] = {}, dp[kQTiles][4] = {};
    ring.wait(it);  // Q and dO tiles of iteration it have landed
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      load_a<Bc>(ka, k_base, 16 * warp, kk);
      load_a<Bc>(va, v_base, 16 * warp, kk);
#pragma unroll
      for (int np = 0; np < kQTiles / 2; ++np) {
        uint32_t qb[4], dob[4];
        load_b<Bq>(qb, q_base, np * 16, kk);
        step4::mma_two_n8<T>(s, np, ka, qb);
        load_b<Bq>(dob, do_base, np * 16, kk);
        step4::mma_two_n8<T>(dp, np, va, dob);
      }
    }
    ring.refill(it, w.n_iter, load_q_do_tiles);  // after this warp's first products: the other warps are likely done with it - 1

    // Element-wise, on the C fragments: s[nt][e] is key key_g + 8 (e / 2), query q0 + 8nt + 2t + e % 2.
    // s becomes Pd^T = P^T Z^T and dp becomes dS^T (device.cuh, p_and_ds; with a bias, stored as dBias too).
    // Only a tile the mask crosses pays for the element test (kTest): the mask's needs.
    auto elementwise = [&](auto test) {
      constexpr bool kTest = decltype(test)::value;
      const auto cols = columns_of(mask, w.b, h, q0);  // each query's Row of the mask (device.cuh)
      const DBiasRows dbias = dbias_rows</*kBiasShaped=*/false>(bp, mask, w.b, h).at(q0 + 2 * t, key_g);  // device.cuh
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + nt * 8 + 2 * t + e % 2, j = key_g + 8 * (e / 2);
          const float z = kDropout ? step4::dropout_z(p.dropout, w.b, h, i, j) : 1.0f;
          const PdS r = p_and_ds(probability<kTest>(mask, s[nt][e], cols.at(i), j, lse2[nt][e % 2], p.scale_log2),
                                 dp[nt][e], z, d_i[nt][e % 2]);
          s[nt][e] = r.pz;
          dp[nt][e] = r.ds;
          dbias.put(8 * nt + e % 2, 8 * (e / 2), r.ds);  // (i, j), with the bias
        }
    };
    if (mask.needs(mask.span(q0, q0 + Bq - 1), k0, Bc)) elementwise(std::true_type{});
    else elementwise(std::false_type{});

    // dV += Pd^T dO and dK += dS^T Q: A = the accumulators repacked (k = query), B = dO (Q) rows with
    // k = query, read with ldmatrix.trans: step 4's O += P V.
#pragma unroll
    for (int kk = 0; kk < Bq / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      acc_to_a<T>(pa, s, kk);
      acc_to_a<T>(dsa, dp, kk);
#pragma unroll
      for (int np = 0; np < kDTiles / 2; ++np) {
        uint32_t b4[4];
        load_b_trans<Bq>(b4, do_base, kk, np * 16);
        step4::mma_two_n8<T>(dv, np, pa, b4);
        load_b_trans<Bq>(b4, q_base, kk, np * 16);
        step4::mma_two_n8<T>(dk, np, dsa, b4);
      }
    }
    ring.release(it);  // this warp is done with the Q and dO tiles of iteration it
  }

  // ---- epilogue: every key row of the tile written once (zeros if no query sees it) ---------------------
  const RowsAt out = rows.kv_rows(p, w.b, w.bh_kv, D);  // the rows of (b, KV head) in dK and dV
  store_rows<T, D>(static_cast<T*>(bp.dk) + out.first, dk, k0 + 16 * warp, seq.Nk, p.scale, 0, out.stride);
  store_rows<T, D>(static_cast<T*>(bp.dv) + out.first, dv, k0 + 16 * warp, seq.Nk, 1.0f, 0, out.stride);
}

}  // namespace fa::step5
