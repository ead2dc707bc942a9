// FlashAttention, step by step — step 5: the dQ kernel (step5_backward/dq.cuh)
//
// What it adds over step 4: nothing new in the machinery; the forward's loop with a different body. A
// block owns Br query rows of one query head, keeps Q and dO in registers, and streams the K/V tiles the
// rows see through a TMA ring. It recomputes S and P (the price of owning dQ without atomics: the dK/dV
// kernel computed them too), then
//   P_ij  = exp(scale S_ij - LSE_i)          masked entries 0
//   dP    = (dO V^T) o Z                     [Br, Bc]  (Z: the dropout multiplier, 0 or 1/(1-p))
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ   += dS K                             [Br, d], times scale at the end
// (FlashAttention-2, Algorithm 2, the S, P, dP, dS and dQ lines of its inner loop, for one query tile.)
// Limits: d = 64 or 128, bf16/fp16; dQ stored straight from registers.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "common/problem.h"
#include "device.cuh"

namespace fa::step5 {

// grid = ceil(Nq / Br) * Hq * B, block = 32 * Warps threads, dynamic shared memory Tr::kSmemBytes.
template <class Tr, bool kDropout>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_do,
              const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v, const BwdParams bp) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages, kPanels = Tr::kPanels;
  constexpr int kSTiles = Bc / 8;  // n8 tiles of S and dP (key columns)
  constexpr int kDTiles = D / 8;   // n8 tiles of dQ (head-dim columns)
  constexpr uint32_t kQBytes = Tr::kQBytes, kKVBytes = Tr::kKVBytes;
  const AttnParams& p = bp.a;

  // ---- shared memory: [Q | dO | K stages | V stages | barriers], panels 1024-byte aligned -------------
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = ptx::align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);                                       // [kPanels][Br, 64]
  T* sdO = reinterpret_cast<T*>(smem + kQBytes);                            // [kPanels][Br, 64]
  T* sK = reinterpret_cast<T*>(smem + 2 * kQBytes);                         // [kStages][kPanels][Bc, 64]
  T* sV = reinterpret_cast<T*>(smem + 2 * kQBytes + kStages * kKVBytes);    // [kStages][kPanels][Bc, 64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + 2 * kQBytes + 2 * kStages * kKVBytes);
  uint64_t* q_full = bars;               // Q and dO tiles landed
  uint64_t* full = bars + 1;             // [kStages] K and V tiles landed
  uint64_t* empty = bars + 1 + kStages;  // [kStages] every warp is done reading them

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  // ---- which rows: as step 4 (causal: the longest rows start first) ------------------------------------
  const int num_m = (p.Nq + Br - 1) / Br;
  int m_block = blockIdx.x % num_m;
  const int bh = blockIdx.x / num_m;
  if (p.causal) m_block = num_m - 1 - m_block;
  const int h = bh % p.Hq, b = bh / p.Hq;
  const int bh_kv = b * p.Hkv + h / p.group;  // GQA: the KV head of this query head
  const int m0 = m_block * Br;

  // K/V tiles these rows see: all of K, or (causal) up to the last row's diagonal.
  const int64_t last_row = min(m0 + Br, p.Nq) - 1;
  const int64_t last_key = p.causal ? min(int64_t(p.Nk) - 1, p.input_pos + last_row) : int64_t(p.Nk) - 1;
  const int n_tiles = last_key < 0 ? 0 : int(last_key / Bc) + 1;

  // One thread issues every TMA copy: K and V tile `tile` into ring slot tile % kStages.
  auto load_tile = [&](int tile) {
    const int stage = tile % kStages;
    ptx::mbar_arrive_expect_tx(&full[stage], 2 * kKVBytes);
#pragma unroll
    for (int c = 0; c < kPanels; ++c) {
      ptx::tma_load_3d(sK + (stage * kPanels + c) * Bc * 64, &tm_k, c * 64, tile * Bc, bh_kv, &full[stage]);
      ptx::tma_load_3d(sV + (stage * kPanels + c) * Bc * 64, &tm_v, c * 64, tile * Bc, bh_kv, &full[stage]);
    }
  };
  auto parity = [](int tile) { return uint32_t(tile / kStages) & 1; };
  // Producer (one thread), in iteration n >= 1: tile n + kStages - 1 into the slot of tile n - 1, once
  // every warp has released it (at the end of its iteration n - 1).
  auto refill = [&](int n) {
    if (threadIdx.x == 0 && n >= 1 && n + kStages - 1 < n_tiles) {
      ptx::mbar_wait(&empty[(n - 1) % kStages], parity(n - 1));
      load_tile(n + kStages - 1);
    }
  };

  // ---- prologue: barriers, then Q, dO and the first kStages K/V tiles in flight ------------------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], Tr::kWarps);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(q_full, 2 * kQBytes);
#pragma unroll
    for (int c = 0; c < kPanels; ++c) {
      ptx::tma_load_3d(sQ + c * Br * 64, &tm_q, c * 64, m0, bh, q_full);
      ptx::tma_load_3d(sdO + c * Br * 64, &tm_do, c * 64, m0, bh, q_full);
    }
    for (int n = 0; n < kStages && n < n_tiles; ++n) load_tile(n);
  }

  // Q and dO: shared -> registers, once; warp w holds rows 16w .. 16w+15 as A fragments of every k16 step.
  ptx::mbar_wait(q_full, 0);
  uint32_t qa[D / 16][4], doa[D / 16][4];
  const uint32_t q_base = ptx::smem_u32(sQ), do_base = ptx::smem_u32(sdO);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    load_a<Br>(qa[kk], q_base, 16 * warp, kk);
    load_a<Br>(doa[kk], do_base, 16 * warp, kk);
  }

  // LSE (in log2 units) and D of this thread's rows g and g + 8; rows beyond Nq are masked below.
  const int row_g = m0 + 16 * warp + g;
  float lse2[2], d_i[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in_q = row_g + 8 * r < p.Nq;
    lse2[r] = in_q ? p.lse[int64_t(bh) * p.Nq + row_g + 8 * r] * kLog2e : 0.0f;
    d_i[r] = in_q ? bp.dsum[int64_t(bh) * p.Nq + row_g + 8 * r] : 0.0f;
  }

  float dq[kDTiles][4] = {};  // rows g, g+8 of the warp; columns 8nd + 2t, +1
  for (int n = 0; n < n_tiles; ++n) {
    const int stage = n % kStages;
    const uint32_t k_base = ptx::smem_u32(sK + stage * kPanels * Bc * 64);
    const uint32_t v_base = ptx::smem_u32(sV + stage * kPanels * Bc * 64);

    // S = Q K^T and dPd = dO V^T: [16 rows, Bc keys] per warp; B = K (V) rows, k = head dim (step 4's S).
    float s[kSTiles][4] = {}, dp[kSTiles][4] = {};
    ptx::mbar_wait(&full[stage], parity(n));  // K and V tile n have landed
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4], vb[4];
        load_b<Bc>(kb, k_base, np * 16, kk);
        ptx::mma_16816<T>(s[2 * np], qa[kk], {kb[0], kb[1]});
        ptx::mma_16816<T>(s[2 * np + 1], qa[kk], {kb[2], kb[3]});
        load_b<Bc>(vb, v_base, np * 16, kk);
        ptx::mma_16816<T>(dp[2 * np], doa[kk], {vb[0], vb[1]});
        ptx::mma_16816<T>(dp[2 * np + 1], doa[kk], {vb[2], vb[3]});
      }
    refill(n);  // after this warp's first products: the other warps are likely done with n - 1

    // Element-wise, on the C fragments: s[nt][e] is row row_g + 8 (e / 2), key n Bc + 8nt + 2t + e % 2.
    // s becomes dS = P (dPd Z - D); masked entries are selected to 0, never computed into a NaN. Only
    // tiles that cross an edge or the diagonal pay for that test (kMasked), as in the dK/dV kernel.
    auto elementwise = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = row_g + 8 * r, j0 = n * Bc + nt * 8 + 2 * t;
          float z[2] = {1.0f, 1.0f};
          if constexpr (kDropout) dropout_z2(p.dropout, b, h, i, j0, z[0], z[1]);
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = 2 * r + c, j = j0 + c;
            const bool vis = !kMasked || (i < p.Nq && j < p.Nk && sees(p.causal, p.input_pos, i, j));
            const float pr = vis ? ptx::exp2_approx(fmaf(s[nt][e], p.scale_log2, -lse2[r])) : 0.0f;
            s[nt][e] = pr * (dp[nt][e] * z[c] - d_i[r]);
          }
        }
    };
    if (tile_needs_mask(p, m0, Br, n * Bc, Bc))
      elementwise(std::true_type{});
    else
      elementwise(std::false_type{});

    // dQ += dS K: A = dS repacked (k = key), B = K rows with k = key, read with ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t dsa[4];
      acc_to_a<T>(dsa, s, kk);
#pragma unroll
      for (int np = 0; np < kDTiles / 2; ++np) {
        uint32_t kb[4];
        load_b_trans<Bc>(kb, k_base, kk, np * 16);
        ptx::mma_16816<T>(dq[2 * np], dsa, {kb[0], kb[1]});
        ptx::mma_16816<T>(dq[2 * np + 1], dsa, {kb[2], kb[3]});
      }
    }
    __syncwarp();  // every lane's ldmatrix reads of the slot are done ...
    if (lane == 0) ptx::mbar_arrive(&empty[stage]);  // ... before the warp releases it to the producer
  }

  // ---- epilogue: every row of the tile below Nq written once (zeros for a row that sees no key) ---------
  store_rows<T, D>(static_cast<T*>(bp.dq) + int64_t(bh) * p.Nq * D, dq, m0 + 16 * warp, p.Nq, p.scale);
}

}  // namespace fa::step5
