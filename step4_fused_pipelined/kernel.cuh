// FlashAttention, step by step — step 4: the fused, TMA-pipelined tensor-core kernel
// (step4_fused_pipelined/kernel.cuh)
//
// What it adds over step 3: the same online-softmax loop (FlashAttention-2, Algorithm 1), with the data
// movement and the arithmetic of a real kernel:
//  - a block owns Br = 16 x Warps query rows; TMA copies its Q tile into shared memory once, ldmatrix moves
//    it into registers, and it stays there for the whole loop;
//  - K and V tiles of Bc keys stream through a ring of `Stages` shared-memory buffers filled by TMA
//    (cp.async.bulk.tensor). Each stage has a "full" mbarrier per tensor (TMA signals the bytes landed)
//    and an "empty" one (every warp signals it is done reading), so the copies of tile j+1.. overlap the
//    math of tile j;
//  - 128-byte swizzled tiles (TMA writes them, ldmatrix reads them without bank conflicts);
//  - S = Q K^T and O += P V on the tensor cores (mma.sync.m16n8k16, fp32 accumulators); P goes from the
//    S accumulators straight into A fragments: no shared-memory round trip;
//  - causal: tiles above the diagonal are never loaded, and only tiles that cross it are masked.
// Paper equations (FlashAttention-2, Alg. 1, lines 8-12), per K/V tile j, rows of the block's tile i:
//   S_i^(j) = Q_i K_j^T;  m_i^(j) = max(m_i^(j-1), rowmax(S_i^(j)));  P_i^(j) = exp(S_i^(j) - m_i^(j))
//   l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_i^(j));  O_i^(j) = e^(..) O_i^(j-1) + P_i^(j) V_j
//   and at the end O_i = O_i / l_i, LSE_i = m_i + log(l_i)   (the scale is folded into exp2, softmax.h).
// Limits: d = 64 or 128, bf16/fp16, scale > 0; every warp reads the whole K and V tile from shared memory
// (the cost of 16-row warp tiles with mma.sync); no warp specialisation (sm_120 has no setmaxnreg).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "common/dropout.h"
#include "common/gpu_runner.h"
#include "common/ptx.h"
#include "kernel_traits.h"
#include "mask.h"
#include "softmax.h"

namespace fa::step4 {

// Multiplies the probabilities by the dropout keep mask / (1 - p). Thread columns 2t, 2t+1 of an n8 tile
// share one Philox call: both fall in the same group of four keys (common/dropout.h), at words 0, 1 for
// even t and 2, 3 for odd t. (Selecting with ?: keeps the words in registers; indexing w.v[] with a
// run-time index would put them in local memory.)
template <int kSTiles>
__device__ __forceinline__ void apply_dropout(float (&s)[kSTiles][4], const DropoutParams& dp, int b, int h,
                                              int row_g, int key_2t) {
  const bool odd = key_2t & 2;
#pragma unroll
  for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = key_2t + nt * 8;
      const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), uint32_t(row_g + 8 * r), uint32_t(j >> 2));
      const uint32_t w0 = odd ? w.v[2] : w.v[0], w1 = odd ? w.v[3] : w.v[1];
      s[nt][2 * r] *= w0 >= dp.threshold ? dp.keep_scale : 0.0f;
      s[nt][2 * r + 1] *= w1 >= dp.threshold ? dp.keep_scale : 0.0f;
    }
}

// grid = (ceil(Nq / Br) * Hq * B), block = 32 * Warps threads, dynamic shared memory Tr::kSmemBytes.
template <class Tr, bool kDropout>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    fused_forward(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                  const AttnParams p) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages, kPanels = Tr::kPanels;
  constexpr int kQSteps = D / 16;  // k16 steps of Q K^T
  constexpr int kSTiles = Bc / 8;  // n8 tiles of S
  constexpr int kOTiles = D / 8;   // n8 tiles of O
  constexpr uint32_t kKVBytes = Tr::kKVBytes;

  // ---- shared memory: [Q | K stages | V stages | barriers], panels 1024-byte aligned ----------------
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = ptx::align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);                                         // [kPanels][Br, 64]
  T* sK = reinterpret_cast<T*>(smem + Tr::kQBytes);                           // [kStages][kPanels][Bc, 64]
  T* sV = reinterpret_cast<T*>(smem + Tr::kQBytes + kStages * kKVBytes);      // [kStages][kPanels][Bc, 64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Tr::kQBytes + 2 * kStages * kKVBytes);
  uint64_t* q_full = bars;                   // Q tile landed
  uint64_t* k_full = bars + 1;               // [kStages] K tile landed
  uint64_t* v_full = bars + 1 + kStages;     // [kStages] V tile landed
  uint64_t* k_empty = bars + 1 + 2 * kStages;  // [kStages] every warp is done reading the K tile
  uint64_t* v_empty = bars + 1 + 3 * kStages;  // [kStages] every warp is done reading the V tile

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  // ---- which tile: query tiles of one head are neighbours in the grid, so they share K/V in L2; with a
  // causal mask the longest rows (the last tiles, bottom-right alignment) start first ------------------
  const int num_m = (p.Nq + Br - 1) / Br;
  int m_block = blockIdx.x % num_m;
  const int bh = blockIdx.x / num_m;
  if (p.causal) m_block = num_m - 1 - m_block;
  const int h = bh % p.Hq, b = bh / p.Hq;
  const int bh_kv = b * p.Hkv + h / p.group;  // GQA: the KV head of this query head
  const int m0 = m_block * Br;

  // K/V tiles this query tile sees: all of K, or (causal) up to the last row's diagonal.
  const int64_t last_row = min(m0 + Br, p.Nq) - 1;
  const int64_t last_key = p.causal ? min(int64_t(p.Nk) - 1, p.input_pos + last_row) : int64_t(p.Nk) - 1;
  const int n_tiles = last_key < 0 ? 0 : int(last_key / Bc) + 1;

  // One thread issues every TMA copy: tile `tile` of K (or V) into ring slot tile % kStages.
  auto load_tile = [&](const CUtensorMap* map, T* ring, uint64_t* full, int tile) {
    const int stage = tile % kStages;
    ptx::mbar_arrive_expect_tx(&full[stage], kKVBytes);
#pragma unroll
    for (int c = 0; c < kPanels; ++c)
      ptx::tma_load_3d(ring + (stage * kPanels + c) * Bc * 64, map, c * 64, tile * Bc, bh_kv, &full[stage]);
  };
  auto release = [&](uint64_t* empty, int tile) {  // this warp no longer reads ring slot tile % kStages
    __syncwarp();  // every lane's ldmatrix reads of the slot are done
    if (lane == 0) ptx::mbar_arrive(&empty[tile % kStages]);
  };
  // Phase parity of the use of ring slot tile % kStages by `tile` (a slot's barriers complete once per use).
  auto parity = [](int tile) { return uint32_t(tile / kStages) & 1; };
  // Producer (one thread), in iteration n >= 1: K and V tile n + kStages - 1 into the slots of tile n - 1,
  // which every warp released in its previous iteration (K after its Q K^T, V after its P V).
  auto refill = [&](int n) {
    if (threadIdx.x == 0 && n >= 1 && n + kStages - 1 < n_tiles) {
      ptx::mbar_wait(&k_empty[(n - 1) % kStages], parity(n - 1));
      load_tile(&tm_k, sK, k_full, n + kStages - 1);
      ptx::mbar_wait(&v_empty[(n - 1) % kStages], parity(n - 1));
      load_tile(&tm_v, sV, v_full, n + kStages - 1);
    }
  };

  // ---- prologue: barriers, then Q and the first kStages tiles of K and of V in flight -----------------
  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&k_full[s], 1);
      ptx::mbar_init(&v_full[s], 1);
      ptx::mbar_init(&k_empty[s], Tr::kWarps);
      ptx::mbar_init(&v_empty[s], Tr::kWarps);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before any thread waits on them or TMA signals them
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(q_full, uint32_t(Tr::kQBytes));
#pragma unroll
    for (int c = 0; c < kPanels; ++c) ptx::tma_load_3d(sQ + c * Br * 64, &tm_q, c * 64, m0, bh, q_full);
    for (int n = 0; n < kStages && n < n_tiles; ++n) {
      load_tile(&tm_k, sK, k_full, n);
      load_tile(&tm_v, sV, v_full, n);
    }
  }

  // Q: shared -> registers, once. Warp w reads rows 16w .. 16w+15 as A fragments of every k16 step.
  ptx::mbar_wait(q_full, 0);
  uint32_t q[kQSteps][4];
  const uint32_t q_base = ptx::smem_u32(sQ);
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) {
    const int col = kk * 16 + (lane >> 4) * 8;  // lanes 16..31 address the right 8x8 matrices
    ptx::ldmatrix_x4(q[kk], q_base + (col / 64) * Br * 128 + Tr::smem_offset(16 * warp + (lane & 15), (col % 64) / 8));
  }

  // ---- main loop over K/V tiles -----------------------------------------------------------------------
  float o[kOTiles][4] = {};  // O accumulators: rows g, g+8; columns nd*8 + 2t, +1
  RowSoftmax<kSTiles, kOTiles> softmax;
  const int row_g = m0 + 16 * warp + g;  // absolute query row of this thread's row g

  for (int n = 0; n < n_tiles; ++n) {
    const int stage = n % kStages;
    const uint32_t phase = parity(n);
    if constexpr (kStages == 1) refill(n);  // one slot: tile n can only be loaded once n-1 is released

    // S = Q K^T: [16 rows, Bc keys] per warp. One ldmatrix.x4 gives the B fragments of two n8 tiles.
    float s[kSTiles][4] = {};
    ptx::mbar_wait(&k_full[stage], phase);  // K tile n has landed
    const uint32_t k_base = ptx::smem_u32(sK + stage * kPanels * Bc * 64);
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk)
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        const int key = np * 16 + (lane & 7) + (lane >> 4) * 8;
        const int col = kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t kb[4];
        ptx::ldmatrix_x4(kb, k_base + (col / 64) * Bc * 128 + Tr::smem_offset(key, (col % 64) / 8));
        ptx::mma_16816<T>(s[2 * np], q[kk], {kb[0], kb[1]});
            ptx::mma_16816<T>(s[2 * np + 1], q[kk], {kb[2], kb[3]});
      }
    release(k_empty, n);

    if constexpr (kStages > 1) refill(n);  // after this warp's Q K^T: the other warps are likely done with n-1

    // Mask only where needed: the tail of K, or a tile that crosses this warp's diagonal.
    const int key0 = n * Bc;
    if (key0 + Bc > p.Nk || (p.causal && key0 + Bc - 1 > p.input_pos + m0 + 16 * warp))
      apply_mask(s, row_g, key0 + 2 * t, p.Nk, p.causal, p.input_pos);

    softmax.update(s, o, p.scale_log2);  // s now holds P (unnormalised), o is rescaled
    if constexpr (kDropout) apply_dropout(s, p.dropout, b, h, row_g, key0 + 2 * t);

    // P: fp32 C fragments of two n8 tiles = one 16-bit A fragment of a k16 step of P V.
    uint32_t pa[Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      pa[kk][0] = ptx::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = ptx::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = ptx::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = ptx::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }

    // O += P V: V's rows are keys (the k dimension), so ldmatrix.trans turns them into B fragments.
    ptx::mbar_wait(&v_full[stage], phase);  // V tile n has landed
    const uint32_t v_base = ptx::smem_u32(sV + stage * kPanels * Bc * 64);
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kOTiles / 2; ++np) {
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int col = np * 16 + (lane >> 4) * 8;
        uint32_t vb[4];
        ptx::ldmatrix_x4_trans(vb, v_base + (col / 64) * Bc * 128 + Tr::smem_offset(key, (col % 64) / 8));
        ptx::mma_16816<T>(o[2 * np], pa[kk], {vb[0], vb[1]});
        ptx::mma_16816<T>(o[2 * np + 1], pa[kk], {vb[2], vb[3]});
      }

    release(v_empty, n);
  }

  // ---- epilogue: normalise, stage O in this warp's own rows of the Q tile, TMA store ------------------
  float inv_l[2], lse[2];
  softmax.finish(inv_l, lse, p.scale_log2);
  uint8_t* sO = reinterpret_cast<uint8_t*>(sQ);  // the warp alone read these 16 rows of Q: safe to reuse,
  __syncwarp();  // ... once every lane's ldmatrix of them is done (a tile with no K/V trip has no other sync)
#pragma unroll
  for (int nd = 0; nd < kOTiles; ++nd) {
    const int col = nd * 8 + 2 * t;
    const uint32_t panel = (col / 64) * Br * 128;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t off = panel + Tr::smem_offset(16 * warp + g + 8 * r, (col % 64) / 8) + (col % 8) * 2;
      *reinterpret_cast<uint32_t*>(sO + off) = ptx::pack2<T>(o[nd][2 * r] * inv_l[r], o[nd][2 * r + 1] * inv_l[r]);
    }
  }
  ptx::fence_async_shared();  // the TMA store (async proxy) must see these ordinary stores
  __syncwarp();               // ... from every lane of the warp
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < kPanels; ++c)
      ptx::tma_store_3d(&tm_o, c * 64, m0 + 16 * warp, bh, sQ + c * Br * 64 + 16 * warp * 64);
    ptx::tma_store_commit_and_wait();  // shared memory must outlive the store's reads
  }
  if (p.lse && t == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_g + 8 * r < p.Nq) p.lse[int64_t(bh) * p.Nq + row_g + 8 * r] = lse[r];
}

}  // namespace fa::step4
