// FlashAttention, step by step — step 5: FlashAttention 2's single backward kernel (step5_backward/atomic.cuh)
//
// What it adds over the dK/dV kernel (dkdv.cuh), two things:
// 1. dQ in the same kernel. The block also adds its share of dQ into an fp32 buffer with atomics
//    (FlashAttention-2, Algorithm 2, its last line), so S and dP are computed once: 5 matrix products
//    instead of the deterministic variant's 7, at the price of a summation order that varies run to run.
// 2. Two-dimensional warp layouts. In dkdv.cuh each warp owns 16 keys for every product, so all warps read
//    the whole Q and dO tile, twice: the kernel is bound by shared-memory bandwidth. Here each product has
//    a warp grid (traits.h, AtomicTraits; the sm_90 defaults at d = 64 / 128, Bc = 128, Bq = 128 / 64):
//      product     per warp                   grid (d = 64 / 128)                 tile (d = 64 / 128)
//      S^T, dP^T   kWarpKeys x kWarpQueries   2 x 4 over keys x queries           64 x 32 / 64 x 16
//      dV, dK      kWarpKeysDkv x kWarpDkv    4 x 2 over keys x columns           32 x 32 / 32 x 64
//      dQ          kWarpQueriesDq x kWarpDq   4 x 2 / 2 x 4 over queries x cols   32 x 32 / 32 x 32
//    so each operand tile is read by a few warps. The price: a warp's dV, dK and dQ need P^T and dS^T of
//    queries and keys other warps computed, so both are parked in shared memory (stmatrix) and a split
//    barrier separates their stores from those reads (docs/history/step5.md#the-atomic-kernel).
// Also: each block starts its sweep over the query tiles at its own key tile's index (KeyBlockWork's
// rotate, device.cuh: the blocks of one head add into different dQ rows at a time, #13); the LSE and D of
// a step's queries are staged in shared memory one step ahead (#18); at d = 64 the Bq = 128 tiles leave
// room for only `lean` P^T/dS^T buffers and a bufs_free barrier (traits.h, #16), and the ldmatrix
// addresses are XOR-stepped (device.cuh, Operand; #20).
// Paper equations (FlashAttention-2, Algorithm 2, the inner loop, transposed as in dkdv.cuh; i: query,
// j: key; Z: the dropout multiplier, 0 or 1/(1-p)):
//   S^T = K Q^T,  P^T_ji = exp(scale S^T_ji - LSE_i)          [Bc, Bq]  masked entries 0
//   dP^T = (V dO^T) o Z^T,  dS^T_ji = P^T_ji (dP^T_ji - D_i)  [Bc, Bq]
//   dV += (P^T o Z^T) dO,  dK += dS^T Q                       [Bc, d]   (dK times scale at the end)
//   dQ_i += dS K                                              [Bq, d]   fp32 atomics (scale applied later)
// With 4e's score modifiers as the mask type, as dkdv.cuh: S^T through the modifier and mask (P^T then after
// dP^T: dS_pre needs S' for the softcap's derivative), windowed query tiles skipped, and dS_pre is dBias:
// stored for a full bias, but added with float atomics into a broadcast one (device.cuh, DBiasRows), so
// that its dBias, like its dQ, is not bit-reproducible from run to run.
// Limits: d = 64 or 128, bf16/fp16; the sm_90 tiles (201 / 220 KB of shared memory at d = 64 / 128) do not
// fit sm_120's 99 KB, which takes smaller tiles (configs.h).
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

// acc += A B^T for one warp over KSteps k-steps of 16: A = 16 MK rows (a.load(frag, 16 mi, kk)), B = 8 NQ
// rows (b.load(frag, 16 np, kk), two n8 tiles per load). Each A fragment serves NQ products and each B
// fragment MK: the reuse a two-dimensional warp tile buys. S^T, dP^T (k = the head dim) and dQ (k = keys).
template <int KSteps, class T, int MK, int NQ, class AOp, class BOp>
__device__ __forceinline__ void warp_product(float (&acc)[MK][NQ][4], const AOp& a_op, const BOp& b_op) {
#pragma unroll
  for (int kk = 0; kk < KSteps; ++kk) {
    uint32_t a[MK][4];
#pragma unroll
    for (int mi = 0; mi < MK; ++mi) a_op.load(a[mi], 16 * mi, kk);
#pragma unroll
    for (int np = 0; np < NQ / 2; ++np) {
      uint32_t b[4];
      b_op.load(b, 16 * np, kk);
#pragma unroll
      for (int mi = 0; mi < MK; ++mi) {
        step4::mma_two_n8<T>(acc[mi], np, a[mi], b);
      }
    }
  }
}

// dQ's A operand: dS, read transposed out of the stored dS^T [keys, kPitch] from query q0 on. Matrix
// m = lane / 8 of a load: keys 16kk + 8 (m / 2), queries q0 + row + 8 (m % 2).
template <class T, int kPitch>
struct DsTransposed {
  uint32_t base;
  int q0, lane;
  __device__ __forceinline__ void load(uint32_t (&a)[4], int row, int kk) const {
    const int key = 16 * kk + (lane & 7) + 8 * (lane >> 4), query = q0 + row + 8 * ((lane >> 3) & 1);
    ptx::ldmatrix_x4_trans(a, base + uint32_t(key * kPitch + query) * sizeof(T));
  }
};

// grid = ceil(Nk / Bc) * Hkv * B, block = 32 * WarpsK * WarpsQ threads, dynamic shared memory AtomicSmem<Tr>::kBytes().
template <class Tr, bool kDropout, class Mask = step4::CausalMask>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    atomic_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                  const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v, const BwdParams bp) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Bc = Tr::Bc, Bq = Tr::Bq, kStages = Tr::kStages, kPitch = Tr::kPitch;
  constexpr int kMK = Tr::kWarpKeys / 16;       // m16 tiles of keys per warp      (S^T, dP^T)
  constexpr int kNQ = Tr::kWarpQueries / 8;     // n8 tiles of queries per warp    (S^T, dP^T)
  constexpr int kMKd = Tr::kWarpKeysDkv / 16;   // m16 tiles of keys per warp      (dV, dK)
  constexpr int kND = Tr::kWarpDkv / 8;         // n8 tiles of head dim per warp   (dV, dK)
  constexpr int kMQ = Tr::kWarpQueriesDq / 16;  // m16 tiles of queries per warp   (dQ)
  constexpr int kNDq = Tr::kWarpDq / 8;         // n8 tiles of head dim per warp   (dQ)
  const AttnParams& p = bp.a;

  FA_KERNEL_NEEDS_SMEM(AtomicSmem<Tr>::kBytes());  // more than this GPU's blocks may have: a trap (gpu/gpu_types.h)
  extern __shared__ uint8_t smem_raw[];
  AtomicSmem<Tr>& sm = *reinterpret_cast<AtomicSmem<Tr>*>(step4::align_1024(smem_raw));
  const step4::TmaRing<kStages> ring{sm.full, sm.empty};  // the Q/dO ring
  float* sLD = &sm.lse_d[0][0][0];                         // [2][LSE (log2 units), D][Bq], flat

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wk = warp % Tr::kWarpsK, wq = warp / Tr::kWarpsK;
  const int key0 = wk * Tr::kWarpKeys;     // this warp's first key (in the tile): S^T, dP^T rows
  const int qry0 = wq * Tr::kWarpQueries;  // its first query (in the step's tile): S^T columns
  const int keyd0 = warp % Tr::kDkvWarpsK * Tr::kWarpKeysDkv;  // on the dV/dK grid: its first key (rows)
  const int dkv0 = warp / Tr::kDkvWarpsK * Tr::kWarpDkv;       // and its first head-dim column
  const int qdq0 = warp / Tr::kDqWarpsD * Tr::kWarpQueriesDq;  // on the dQ grid: its first query (rows)
  const int dq0 = warp % Tr::kDqWarpsD * Tr::kWarpDq;          // and its first head-dim column
  const Mask mask(p);                                      // which keys each query sees (step 4's mask.h)
  const KeyBlockWork w(p, mask, Bc, Bq, /*rotate=*/true);  // which keys, which query tiles (device.cuh)
  auto load_q_do_tiles = [&](int it) { load_q_do<Tr>(sm, ring, w, p.Hq, it, &tm_q, &tm_do); };

  // The LSE (in log2 units) and D of iteration it's Bq query rows go through shared memory: thread x < Bq
  // fetches LSE of row q0 + x, thread Bq + x its D (past Nq: LSE +inf, D 0), one iteration ahead, so that a warp reads
  // its columns' values from shared memory when it needs them instead of holding global loads in flight
  // across a product (they were the kernel's long-scoreboard stalls). Slot it % 2 holds iteration it's.
  auto fetch_lse_d = [&](int it) {
    const int x = threadIdx.x % Bq, i = w.q0(it) + x;
    if (threadIdx.x >= 2 * Bq) return 0.0f;
    if (i >= p.Nq) return threadIdx.x < Bq ? INFINITY : 0.0f;  // past Q: LSE = +inf makes P = 0 (device.cuh)
    const int64_t row = (int64_t(w.b) * p.Hq + w.head(it)) * p.Nq + i;
    return threadIdx.x < Bq ? p.lse[row] * kLog2e : bp.dsum[row];
  };
  auto stage_lse_d = [&](int it, float v) {
    if (threadIdx.x < 2 * Bq) sLD[(it % 2) * 2 * Bq + threadIdx.x] = v;
  };
  // Columns q0 + qry0 + 8nt + 2t + c (c = 0, 1) of row `which` (0: LSE, 1: D) of iteration it's slot.
  auto read_lse_d = [&](float (&v)[kNQ][2], int it, int which) {
#pragma unroll
    for (int nt = 0; nt < kNQ; ++nt) {
      const float2 pair = *reinterpret_cast<const float2*>(sLD + ((it % 2) * 2 + which) * Bq + qry0 + 8 * nt + 2 * t);
      v[nt][0] = pair.x;
      v[nt][1] = pair.y;
    }
  };

  // ---- prologue: barriers, then K, V and the first kStages Q/dO tiles in flight ------------------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.kv_full, 1);
    ring.init(Tr::kWarps);
    for (int s = 0; s < Tr::kDsBufs; ++s) ptx::mbar_init(&sm.ds_ready[s], Tr::kThreads);
    if constexpr (Tr::kLean) ptx::mbar_init(&sm.lean.bufs_free, Tr::kThreads);
    ptx::fence_barrier_init();
  }
  if (w.n_iter > 0) stage_lse_d(0, fetch_lse_d(0));
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them; LSE, D of it 0
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(&sm.kv_full, 2 * Tr::kKVBytes);  // K and V: one barrier for both tiles
    tma_load_pair<typename Tr::KVTile>(sm.k, &tm_k, sm.v, &tm_v, w.k0, w.bh_kv, &sm.kv_full);
    for (int n = 0; n < kStages && n < w.n_iter; ++n) load_q_do_tiles(n);
  }
  ptx::mbar_wait(&sm.kv_full, 0);  // K and V have landed (read for the whole kernel, never overwritten)
  const uint32_t k_base = ptx::smem_u32(sm.k), v_base = ptx::smem_u32(sm.v);
  constexpr bool kXor = Tr::kXorSteps;
  const Operand<Bc, Frag::kA, kXor> k_a(k_base, key0), v_a(v_base, key0);  // S^T, dP^T: A = K, V rows
  const Operand<Bc, Frag::kBTrans, kXor> k_bt(k_base, dq0);                // dQ: B = K, k = keys

  // dQ_i += dS K for the queries of iteration `it`: [kWarpQueriesDq, kWarpDq] per warp, k = the Bc keys.
  // A = dS, read transposed out of the stored dS^T [keys, queries]; B = K rows (k = keys), as in dq.cuh.
  // The sums go into dq_accum with 8-byte atomics: blocks of other key tiles add into the same rows.
  auto add_dq = [&](int it) {
    const uint32_t ds_base = ptx::smem_u32(sm.ds[it % Tr::kDsBufs]);
    float acc[kMQ][kNDq][4] = {};
    warp_product<Bc / 16, T>(acc, DsTransposed<T, kPitch>{ds_base, qdq0, lane}, k_bt);
    const int q0 = w.q0(it);
    float* dq_rows = bp.dq_accum + ((int64_t(w.b) * p.Hq + w.head(it)) * p.Nq + q0) * D;  // [Bq, D] of head h
#pragma unroll
    for (int mq = 0; mq < kMQ; ++mq)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = qdq0 + 16 * mq + g + 8 * r;
        if (q0 + row >= p.Nq) continue;  // zero-filled rows past the end of Q: nothing to add, nowhere to add it
#pragma unroll
        for (int nd = 0; nd < kNDq; ++nd)
          FA_SM90_OR_TRAP(atomicAdd(reinterpret_cast<float2*>(dq_rows + row * D + dq0 + 8 * nd + 2 * t),
                                    make_float2(acc[mq][nd][2 * r], acc[mq][nd][2 * r + 1])));  // 8 bytes: sm_90
      }
  };

  float dk[kMKd][kND][4] = {}, dv[kMKd][kND][4] = {};  // rows: keys keyd0 + 16mi + g (+8); columns dkv0 + 8nd + 2t
  for (int it = 0; it < w.n_iter; ++it) {
    const int h = w.head(it), q0 = w.q0(it);
    const uint32_t q_base = ptx::smem_u32(sm.q[ring.slot(it)]), do_base = ptx::smem_u32(sm.dout[ring.slot(it)]);
    const float lse_d_next = it + 1 < w.n_iter ? fetch_lse_d(it + 1) : 0.0f;  // staged before ds_ready below

    // S^T = K Q^T: [kWarpKeys, kWarpQueries] per warp.
    float s[kMK][kNQ][4] = {};
    ring.wait(it);  // Q and dO tiles of iteration it have landed
    warp_product<D / 16, T>(s, k_a, Operand<Bq, Frag::kB, kXor>(q_base, qry0));

    float lse2[kNQ][2];  // of this thread's query columns q0 + qry0 + 8nt + 2t + c
    read_lse_d(lse2, it, 0);

    // P^T, in place of S^T (device.cuh, probability): s[mi][nt][e] is key k0 + key0 + 16mi + g + 8 (e / 2),
    // query q0 + qry0 + 8nt + 2t + e % 2. Only a tile the mask crosses pays for the element test (kTest).
    // Done before dP^T so that the LSEs die before dP^T's registers are live (this kernel sits at the
    // 255-register limit). With a softcap (kDefer), the pre-softcap score X stays in s instead: dS^T needs it
    // for the softcap's derivative, and P^T is computed from it after dP^T, below.
    constexpr bool kDefer = kHasSoftcap<Mask>;
    const auto cols = columns_of(mask, w.b, h, q0);  // each query's Row of the mask (device.cuh)
    auto probabilities = [&](auto test) {
      [[maybe_unused]] constexpr bool kTest = decltype(test)::value;  // (unused with kDefer: X needs no test)
#pragma unroll
      for (int mi = 0; mi < kMK; ++mi)
#pragma unroll
        for (int nt = 0; nt < kNQ; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = q0 + qry0 + nt * 8 + 2 * t + e % 2, j = w.k0 + key0 + 16 * mi + g + 8 * (e / 2);
            if constexpr (kDefer) s[mi][nt][e] = mask.pre(s[mi][nt][e], cols.at(i), j);
            else s[mi][nt][e] = probability<kTest>(mask, s[mi][nt][e], cols.at(i), j, lse2[nt][e % 2], p.scale_log2).p;
          }
    };
    if (mask.needs(mask.span(q0, q0 + Bq - 1), w.k0, Bc)) probabilities(std::true_type{});
    else probabilities(std::false_type{});

    // dPd^T = V dO^T: the same product with V and dO.
    float dp[kMK][kNQ][4] = {};
    warp_product<D / 16, T>(dp, v_a, Operand<Bq, Frag::kB, kXor>(do_base, qry0));
    ring.refill(it, w.n_iter, load_q_do_tiles);  // after this warp's first products: the other warps are likely done with it - 1

    // s becomes Pd^T = P^T Z^T and dp becomes dS^T (device.cuh, p_and_ds: times the softcap's derivative, with
    // P^T from X first if kDefer; with a bias, dS^T is also dBias).
    float d_i[kNQ][2], lse2x[kNQ][2];
    read_lse_d(d_i, it, 1);
    if constexpr (kDefer) read_lse_d(lse2x, it, 0);
    const DBiasRows dbias = dbias_rows</*kBiasShaped=*/true>(bp, mask, w.b, h).at(q0 + qry0 + 2 * t, w.k0 + key0 + g);
#pragma unroll
    for (int mi = 0; mi < kMK; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + qry0 + nt * 8 + 2 * t + e % 2, j = w.k0 + key0 + 16 * mi + g + 8 * (e / 2);
          const float z = kDropout ? step4::dropout_z(p.dropout, w.b, h, i, j) : 1.0f;
          Prob pr{s[mi][nt][e], 1.0f};  // P^T, or (kDefer) X
          if constexpr (kDefer) pr = probability_pre(mask, pr.p, lse2x[nt][e % 2], p.scale_log2);
          const PdS r = p_and_ds(pr, dp[mi][nt][e], z, d_i[nt][e % 2]);
          s[mi][nt][e] = r.pz;
          dp[mi][nt][e] = r.ds;
          dbias.put(8 * nt + e % 2, 16 * mi + 8 * (e / 2), r.ds);  // (i, j), with the bias (device.cuh)
        }

    // Park Pd^T and dS^T in shared memory ([Bc, kPitch] tiles, 16-bit pairs straight from the C fragments),
    // then announce them: every thread arrives on ds_ready after its own stores (release). Lean buffers are
    // overwritten only once every thread has read P^T of it - 1 and dS^T of it - 2 (the bufs_free arrivals
    // at the end of iteration it - 1 say so); the products above gave the slowest warp time to get there.
    if constexpr (Tr::kLean)
      if (it > 0) ptx::mbar_wait(&sm.lean.bufs_free, uint32_t(it - 1) & 1);
    const uint32_t p_base = ptx::smem_u32(sm.p[it % Tr::kPBufs]), ds_base = ptx::smem_u32(sm.ds[it % Tr::kDsBufs]);
#pragma unroll
    for (int mi = 0; mi < kMK; ++mi)
#pragma unroll
      for (int np = 0; np < kNQ / 2; ++np) {
        // One stmatrix.x4 per 16 x 16 block: matrix m = lane / 8 is keys 16mi + 8 (m % 2), queries
        // 8 (2np + m / 2) of the warp's, whose C fragments, packed (acc_to_a's order), are r[m].
        const int key = key0 + 16 * mi + 8 * ((lane >> 3) & 1) + (lane & 7), query = qry0 + 16 * np + 8 * (lane >> 4);
        const uint32_t off = uint32_t(key * kPitch + query) * sizeof(T);
        uint32_t r[4];
        acc_to_a<T>(r, s[mi], np);
        ptx::stmatrix_x4(p_base + off, r);
        acc_to_a<T>(r, dp[mi], np);
        ptx::stmatrix_x4(ds_base + off, r);
      }
    // Iteration it + 1's LSE and D go into the slot that iteration it - 1 used: every thread finished reading
    // it before its arrival at it - 1, which this thread waited for; readers wait for this arrival.
    if (it + 1 < w.n_iter) stage_lse_d(it + 1, lse_d_next);
    ptx::mbar_arrive(&sm.ds_ready[it % Tr::kDsBufs]);

    // A split barrier: between the arrival above and the wait below, the previous iteration's dQ (its dS^T
    // is complete: every thread waited for it), so a warp that arrives early works instead of idling.
    // Three dS^T buffers make that safe: buffer it % 3 is written again at iteration it + 3, after its
    // writer's wait at it + 2, which needs every thread's arrival at it + 2, which each makes after its
    // add_dq(it) (in iteration it + 1). P^T is read in its own iteration only: two buffers suffice.
    // Lean (two dS^T buffers, one P^T): the bufs_free wait above orders the reuse instead.
    if (it > 0) add_dq(it - 1);
    ptx::mbar_wait(&sm.ds_ready[it % Tr::kDsBufs], uint32_t(it / Tr::kDsBufs) & 1);

    // dV += Pd^T dO and dK += dS^T Q: [kWarpKeysDkv, kWarpDkv] per warp, k = the Bq queries. A = Pd^T (dS^T)
    // rows of the warp's keys, ldmatrix from the padded tiles; B = dO (Q) rows with k = query (.trans).
    const Operand<Bq, Frag::kBTrans, kXor> do_bt(do_base, dkv0), q_bt(q_base, dkv0);
#pragma unroll
    for (int kk = 0; kk < Bq / 16; ++kk) {
      uint32_t pa[kMKd][4], dsa[kMKd][4];
#pragma unroll
      for (int mi = 0; mi < kMKd; ++mi) {
        const uint32_t off = uint32_t((keyd0 + 16 * mi + (lane & 15)) * kPitch + 16 * kk + (lane >> 4) * 8) * sizeof(T);
        ptx::ldmatrix_x4(pa[mi], p_base + off);
        ptx::ldmatrix_x4(dsa[mi], ds_base + off);
      }
#pragma unroll
      for (int np = 0; np < kND / 2; ++np) {
        uint32_t b4[4];
        do_bt.load(b4, 16 * np, kk);
#pragma unroll
        for (int mi = 0; mi < kMKd; ++mi) {
          step4::mma_two_n8<T>(dv[mi], np, pa[mi], b4);
        }
        q_bt.load(b4, 16 * np, kk);
#pragma unroll
        for (int mi = 0; mi < kMKd; ++mi) {
          step4::mma_two_n8<T>(dk[mi], np, dsa[mi], b4);
        }
      }
    }
    ring.release(it);  // this warp is done with the Q and dO tiles of iteration it
    // Lean: this thread is also done with P^T of iteration it and dS^T of it - 1 (its add_dq came before the
    // wait above). Every thread arrives for its own reads, as on ds_ready.
    if constexpr (Tr::kLean) ptx::mbar_arrive(&sm.lean.bufs_free);
  }
  // The last iteration's dQ: every thread passed its wait on that dS^T, so the tile is complete.
  if (w.n_iter > 0) add_dq(w.n_iter - 1);

  // ---- epilogue: every key row of the tile written once (zeros if no query sees it) ---------------------
  const int64_t kv_off = int64_t(w.bh_kv) * p.Nk * D;
#pragma unroll
  for (int mi = 0; mi < kMKd; ++mi) {
    const int64_t row0 = w.k0 + keyd0 + 16 * mi;
    store_rows<T, D>(static_cast<T*>(bp.dk) + kv_off, dk[mi], row0, p.Nk, p.scale, dkv0);
    store_rows<T, D>(static_cast<T*>(bp.dv) + kv_off, dv[mi], row0, p.Nk, 1.0f, dkv0);
  }
}

}  // namespace fa::step5
