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
// and, in the atomic variant (Tr::kAtomicDq, Algorithm 2's last line), the block's share of dQ:
//   dQ_i += dS K                              [Bq, d], added into fp32 with atomics (scale applied later)
// Per warp every product has the forward's shape: 16 keys play the part of step 4's 16 query rows.
// Limits: d = 64 or 128, bf16/fp16; K and V are re-read from shared memory at every step (their A
// fragments would cost 32 to 64 more registers); dK/dV stored straight from registers.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "common/problem.h"
#include "device.cuh"

namespace fa::step5 {

// Atomic variant: stores a warp's A fragment of dS^T (rows row0 .. row0+15 = keys, k = queries
// col0 .. col0+15) into the padded [Bc, Pitch] tile `ds` as four 32-bit words per thread (ptx.h's order).
template <int Pitch, typename T>
__device__ __forceinline__ void store_a(T* ds, const uint32_t (&a)[4], int row0, int col0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < 4; ++m)
    *reinterpret_cast<uint32_t*>(ds + (row0 + g + 8 * (m % 2)) * Pitch + col0 + 2 * t + 8 * (m / 2)) = a[m];
}

// Atomic variant: dQ_i += dS K for the Bq queries of one iteration, over all Bc keys of the block.
// dS = (dS^T)^T comes out of ds (stored [Bc keys, Bq queries]) through ldmatrix.trans, K out of its
// swizzled tile as in the dQ kernel. Warp w computes query m16-tile w % (Bq / 16) and the kDqCols columns
// of chunk w / (Bq / 16), then adds them into dq_acc ([Bq, D] fp32 rows of one head, starting at query
// q0) with 8-byte atomics: blocks of other key tiles add into the same rows in any order.
template <class Tr>
__device__ __forceinline__ void add_dq(float* dq_acc, const typename Tr::T* ds, uint32_t k_base, int q0, int Nq) {
  using T = typename Tr::T;
  constexpr int kCols = Tr::kDqCols, kMTiles = Tr::Bq / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % kMTiles, col0 = (warp / kMTiles) * kCols;
  const uint32_t ds_base = ptx::smem_u32(ds);
  float acc[kCols / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < Tr::Bc / 16; ++kk) {
    // Matrix m = lane / 8 of the A fragment: keys 16kk + 8 (m / 2), queries 16mt + 8 (m % 2), transposed.
    uint32_t a[4];
    const int key = 16 * kk + (lane & 7) + 8 * (lane >> 4), query = 16 * mt + 8 * ((lane >> 3) & 1);
    ptx::ldmatrix_x4_trans(a, ds_base + uint32_t(key * Tr::kDsPitch + query) * sizeof(T));
#pragma unroll
    for (int np = 0; np < kCols / 16; ++np) {
      uint32_t b4[4];
      load_b_trans<Tr::Bc>(b4, k_base, kk, col0 + np * 16);
      ptx::mma_16816<T>(acc[2 * np], a, {b4[0], b4[1]});
      ptx::mma_16816<T>(acc[2 * np + 1], a, {b4[2], b4[3]});
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * mt + g + 8 * r;
    if (q0 + row >= Nq) continue;  // zero-filled rows past the end of Q: nothing to add, nowhere to add it
#pragma unroll
    for (int nd = 0; nd < kCols / 8; ++nd)
      atomicAdd(reinterpret_cast<float2*>(dq_acc + row * Tr::D + col0 + 8 * nd + 2 * t),
                make_float2(acc[nd][2 * r], acc[nd][2 * r + 1]));
  }
}

// grid = ceil(Nk / Bc) * Hkv * B, block = 32 * Warps threads, dynamic shared memory Tr::kSmemBytes.
template <class Tr, bool kDropout>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
                const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v, const BwdParams bp) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Bc = Tr::Bc, Bq = Tr::Bq, kStages = Tr::kStages, kPanels = Tr::kPanels;
  constexpr int kQTiles = Bq / 8;  // n8 tiles of S^T and dP^T (query columns)
  constexpr int kDTiles = D / 8;   // n8 tiles of dK and dV (head-dim columns)
  constexpr uint32_t kQBytes = Tr::kQBytes, kKVBytes = Tr::kKVBytes;
  const AttnParams& p = bp.a;

  // ---- shared memory: [K | V | Q stages | dO stages | dS x 2 | barriers], panels 1024-byte aligned ------
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* sK = reinterpret_cast<T*>(smem);                                         // [kPanels][Bc, 64]
  T* sV = reinterpret_cast<T*>(smem + kKVBytes);                              // [kPanels][Bc, 64]
  T* sQ = reinterpret_cast<T*>(smem + 2 * kKVBytes);                          // [kStages][kPanels][Bq, 64]
  T* sdO = reinterpret_cast<T*>(smem + 2 * kKVBytes + kStages * kQBytes);     // [kStages][kPanels][Bq, 64]
  T* sdS = reinterpret_cast<T*>(smem + 2 * kKVBytes + 2 * kStages * kQBytes);   // [2][Bc, kDsPitch] (atomic)
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 2 * kKVBytes + 2 * kStages * kQBytes + Tr::kDsBytes);
  uint64_t* kv_full = bars;              // K and V tiles landed
  uint64_t* full = bars + 1;             // [kStages] Q and dO tiles landed
  uint64_t* empty = bars + 1 + kStages;  // [kStages] every warp is done reading them
  uint64_t* ds_ready = bars + 1 + 2 * kStages;  // [2] (atomic) every thread has stored its dS^T values in sdS buffer 0 / 1

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  // ---- which keys: tile n_block of KV head hkv; key tiles of one head are neighbours in the grid -------
  const int num_n = (p.Nk + Bc - 1) / Bc;
  const int n_block = blockIdx.x % num_n;
  const int bh_kv = blockIdx.x / num_n;
  const int hkv = bh_kv % p.Hkv, b = bh_kv / p.Hkv;
  const int k0 = n_block * Bc;

  // Query tiles that see these keys: all, or (causal) from the first row whose diagonal reaches key k0
  // (row i sees key j iff j <= input_pos + i). Iteration `it` walks them for each head of the group.
  const int num_m = (p.Nq + Bq - 1) / Bq;
  int m_first = 0;
  if (p.causal) {
    const int64_t first_row = max(int64_t(0), int64_t(k0) - p.input_pos);
    m_first = first_row >= p.Nq ? num_m : int(first_row / Bq);
  }
  const int per_head = num_m - m_first;
  const int n_iter = per_head * p.group;
  auto head_of = [&](int it) { return hkv * p.group + it / per_head; };  // query head of iteration it
  auto tile_of = [&](int it) { return m_first + it % per_head; };         // its query tile

  // One thread issues every TMA copy: the Q and dO tiles of iteration `it` into ring slot it % kStages.
  auto load_tile = [&](int it) {
    const int stage = it % kStages, bh_q = b * p.Hq + head_of(it), q0 = tile_of(it) * Bq;
    ptx::mbar_arrive_expect_tx(&full[stage], 2 * kQBytes);
#pragma unroll
    for (int c = 0; c < kPanels; ++c) {
      ptx::tma_load_3d(sQ + (stage * kPanels + c) * Bq * 64, &tm_q, c * 64, q0, bh_q, &full[stage]);
      ptx::tma_load_3d(sdO + (stage * kPanels + c) * Bq * 64, &tm_do, c * 64, q0, bh_q, &full[stage]);
    }
  };
  // Phase parity of the use of ring slot it % kStages by iteration `it` (one completion per use).
  auto parity = [](int it) { return uint32_t(it / kStages) & 1; };
  // Producer (one thread), in iteration n >= 1: tiles n + kStages - 1 into the slot of iteration n - 1,
  // once every warp has released it (at the end of its iteration n - 1).
  auto refill = [&](int n) {
    if (threadIdx.x == 0 && n >= 1 && n + kStages - 1 < n_iter) {
      ptx::mbar_wait(&empty[(n - 1) % kStages], parity(n - 1));
      load_tile(n + kStages - 1);
    }
  };

  // ---- prologue: barriers, then K, V and the first kStages Q/dO tiles in flight ------------------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], Tr::kWarps);
    }
    if constexpr (Tr::kAtomicDq)
      for (int s = 0; s < 2; ++s) ptx::mbar_init(&ds_ready[s], Tr::kThreads);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(kv_full, 2 * kKVBytes);
#pragma unroll
    for (int c = 0; c < kPanels; ++c) {
      ptx::tma_load_3d(sK + c * Bc * 64, &tm_k, c * 64, k0, bh_kv, kv_full);
      ptx::tma_load_3d(sV + c * Bc * 64, &tm_v, c * 64, k0, bh_kv, kv_full);
    }
    for (int n = 0; n < kStages && n < n_iter; ++n) load_tile(n);
  }
  ptx::mbar_wait(kv_full, 0);  // K and V have landed (read for the whole kernel, never overwritten)

  float dk[kDTiles][4] = {}, dv[kDTiles][4] = {};  // rows: keys g, g+8 of the warp; columns 8nd + 2t, +1
  const int key_g = k0 + 16 * warp + g;           // absolute key of this thread's row g
  const uint32_t k_base = ptx::smem_u32(sK), v_base = ptx::smem_u32(sV);

  for (int it = 0; it < n_iter; ++it) {
    const int stage = it % kStages, h = head_of(it), q0 = tile_of(it) * Bq;
    const int64_t row_off = (int64_t(b) * p.Hq + h) * p.Nq;  // LSE and D of head h start here
    const uint32_t q_base = ptx::smem_u32(sQ + stage * kPanels * Bq * 64);
    const uint32_t do_base = ptx::smem_u32(sdO + stage * kPanels * Bq * 64);

    // LSE (log2 units) and D of this thread's query columns q0 + 8nt + 2t + c, loaded first so that their
    // latency hides behind the products below.
    float lse2[kQTiles][2], d_i[kQTiles][2];
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = q0 + nt * 8 + 2 * t + c;
        lse2[nt][c] = i < p.Nq ? p.lse[row_off + i] * kLog2e : 0.0f;
        d_i[nt][c] = i < p.Nq ? bp.dsum[row_off + i] : 0.0f;
      }

    // S^T = K Q^T and dPd^T = V dO^T: [16 keys, Bq queries] per warp. A = this warp's 16 rows of K (V),
    // B = Q (dO) rows with k = head dim: step 4's Q K^T with keys and queries swapped.
    float s[kQTiles][4] = {}, dp[kQTiles][4] = {};
    ptx::mbar_wait(&full[stage], parity(it));  // Q and dO tiles of iteration it have landed
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      load_a<Bc>(ka, k_base, 16 * warp, kk);
      load_a<Bc>(va, v_base, 16 * warp, kk);
#pragma unroll
      for (int np = 0; np < kQTiles / 2; ++np) {
        uint32_t qb[4], dob[4];
        load_b<Bq>(qb, q_base, np * 16, kk);
        ptx::mma_16816<T>(s[2 * np], ka, {qb[0], qb[1]});
        ptx::mma_16816<T>(s[2 * np + 1], ka, {qb[2], qb[3]});
        load_b<Bq>(dob, do_base, np * 16, kk);
        ptx::mma_16816<T>(dp[2 * np], va, {dob[0], dob[1]});
        ptx::mma_16816<T>(dp[2 * np + 1], va, {dob[2], dob[3]});
      }
    }
    refill(it);  // after this warp's first products: the other warps are likely done with it - 1

    // Element-wise, on the C fragments: s[nt][e] is key key_g + 8 (e / 2), query q0 + 8nt + 2t + e % 2.
    // s becomes Pd^T = P^T Z^T and dp becomes dS^T = P^T (dPd^T Z^T - D). Masked entries (causal, beyond
    // Nq or Nk, rows that see no key with LSE = -inf) are selected to 0, never computed into a NaN; only
    // tiles that cross an edge or the diagonal pay for that test (kMasked).
    auto elementwise = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = q0 + nt * 8 + 2 * t + e % 2, j = key_g + 8 * (e / 2);
          const bool vis = !kMasked || (i < p.Nq && j < p.Nk && sees(p.causal, p.input_pos, i, j));
          const float pr = vis ? ptx::exp2_approx(fmaf(s[nt][e], p.scale_log2, -lse2[nt][e % 2])) : 0.0f;
          const float z = kDropout ? dropout_z(p.dropout, b, h, i, j) : 1.0f;
          s[nt][e] = pr * z;
          dp[nt][e] = pr * (dp[nt][e] * z - d_i[nt][e % 2]);
        }
    };
    if (tile_needs_mask(p, q0, Bq, k0, Bc))
      elementwise(std::true_type{});
    else
      elementwise(std::false_type{});

    // Atomic variant: park this warp's dS^T rows in sdS and announce them, then do the dV and dK products
    // below before waiting for the other warps' rows: a split barrier (arrive now, wait later), so a warp
    // that arrives early spends the wait on tensor-core work instead of idling at a __syncthreads.
    T* ds_buf = sdS + (it & 1) * Bc * Tr::kDsPitch;
    if constexpr (Tr::kAtomicDq) {
#pragma unroll
      for (int kk = 0; kk < Bq / 16; ++kk) {
        uint32_t dsa[4];
        acc_to_a<T>(dsa, dp, kk);
        store_a<Tr::kDsPitch>(ds_buf, dsa, 16 * warp, 16 * kk);
      }
      ptx::mbar_arrive(&ds_ready[it & 1]);  // every thread: its arrival releases its own stores (and reads)
    }

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
        ptx::mma_16816<T>(dv[2 * np], pa, {b4[0], b4[1]});
        ptx::mma_16816<T>(dv[2 * np + 1], pa, {b4[2], b4[3]});
        load_b_trans<Bq>(b4, q_base, kk, np * 16);
        ptx::mma_16816<T>(dk[2 * np], dsa, {b4[0], b4[1]});
        ptx::mma_16816<T>(dk[2 * np + 1], dsa, {b4[2], b4[3]});
      }
    }
    __syncwarp();  // every lane's ldmatrix reads of the slot are done ...
    if (lane == 0) ptx::mbar_arrive(&empty[stage]);  // ... before the warp releases it to the producer

    if constexpr (Tr::kAtomicDq) {
      // Every thread's dS^T values are in ds_buf (the wait acquires what their arrivals released) before
      // any warp reads the others' keys. Buffer it & 1 serves iterations it, it + 2, ...: phase (it / 2) & 1.
      // Two buffers are enough: a thread writes ds_buf again at iteration it + 2 only after its wait at
      // it + 1, which needs every thread's arrival at it + 1, which each makes after its reads here.
      ptx::mbar_wait(&ds_ready[it & 1], uint32_t(it >> 1) & 1);
      add_dq<Tr>(bp.dq_accum + (row_off + q0) * D, ds_buf, k_base, q0, p.Nq);
    }
  }

  // ---- epilogue: every key row of the tile written once (zeros if no query sees it) ---------------------
  const int64_t kv_off = int64_t(bh_kv) * p.Nk * D;
  store_rows<T, D>(static_cast<T*>(bp.dk) + kv_off, dk, k0 + 16 * warp, p.Nk, p.scale);
  store_rows<T, D>(static_cast<T*>(bp.dv) + kv_off, dv, k0 + 16 * warp, p.Nk, 1.0f);
}

}  // namespace fa::step5
