// FlashAttention, step by step — step 7c: ping-pong and the overlapped softmax (step7_hopper_wgmma/kernel_7c_pingpong.cuh)
//
// What it adds over 7b: the tensor cores are kept busy while the softmax runs, in two ways
// (FlashAttention-3, section 3.2, "intra-warpgroup and inter-warpgroup overlapping of GEMM and softmax"):
//  - inside a warpgroup, iteration n issues S_n = Q K_n^T and O += P_{n-1} V_{n-1} together, waits only for
//    S_n (wgmma.wait_group 1), and runs the softmax of S_n while P_{n-1} V_{n-1} is still on the tensor
//    cores. The softmax therefore cannot rescale O in place: it runs step 4's update in its two halves
//    (softmax.h: update_row returns alpha_n, rescale_row applies it once the product has landed, wait_group 0). P_n is packed after that, since P_{n-1}'s
//    registers are the product's operand until then;
//  - between the two consumer warpgroups, ping-pong: they take turns at issuing their products, ordered by
//    two named barriers (gpu/ptx.h), so one warpgroup's softmax (exp2 on the multi-function unit) runs while
//    the other's products occupy the tensor cores. A warpgroup waits for its turn (bar.sync on its barrier,
//    which completes when the other warpgroup arrives), issues, and hands the turn over (bar.arrive on the
//    other's barrier). Each takes one turn per K/V tile and hands every turn over; warpgroup 1 lets warpgroup
//    0 take the block's first, and warpgroup 0 takes warpgroup 1's last hand-over once it has no turn left
//    (Turns::open, close).
// Per K/V tile n >= 1, in a warpgroup:   [turn] S_n = Q K_n^T, O += P_{n-1} V_{n-1}  [hand over]
//   wait S_n -> mask, m_n, P_n, l_n, alpha_n -> wait P_{n-1} V_{n-1} -> O *= alpha_n -> pack P_n
// and after the loop O += P_last V_last. The equations are 7a's, reordered.
// Limits: as 7a. The producer is 7b's. A block of one consumer warpgroup (Br = 64, kernel_traits.h) runs the same
// loop with the turns off; two or three such blocks share an SM, and their warpgroups take the tensor cores as
// they come. A block of three (Br = 192, d = 64) takes turns in a cycle of three.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "step7_hopper_wgmma/kernel_7b_warp_specialized.cuh"

namespace fa::step7 {

// The turns: warpgroup cw waits on barrier 1 + cw; the warpgroup before it in the cycle arrives there. 256
// threads each time. Two consumer warpgroups take turns 0, 1, 0, 1, ...; three (Br = 192) 0, 1, 2, 0, ...
// A block of one consumer warpgroup (Br = 64) has no one to take turns with: its turns are no-ops.
// cw may be a run-time value (see run_consumer).
template <int kWarpgroups>
struct Turns {
  static constexpr bool kOn = kWarpgroups > 1;
  int cw;
  __device__ void wait() const {
    if constexpr (kOn) ptx::named_barrier_sync_at<256>(1 + cw);
  }
  __device__ void hand_over() const {
    if constexpr (kWarpgroups == 2) ptx::named_barrier_arrive_at<256>(2 - cw);  // no modulo on the hot path
    else if constexpr (kOn) ptx::named_barrier_arrive_at<256>(1 + (cw + 1) % kWarpgroups);
  }
  // Before the block's first turn: the last warpgroup hands warpgroup 0 the first. After the last: warpgroup
  // 0 takes the last warpgroup's last hand-over, so that every arrival on barrier 1 has its wait.
  __device__ void open() const {
    if constexpr (kOn)
      if (cw == kWarpgroups - 1) hand_over();
  }
  __device__ void close() const {
    if constexpr (kOn)
      if (cw == 0) wait();
  }
};

// The turns of a block of Tr: one per consumer warpgroup.
template <class Tr>
using BlockTurns = Turns<Tr::kConsumerWarpgroups>;

// A packed batch's epilogue (kernel_7e_packed.cuh): O and the LSE row by row at the sequence's places.
template <class Tr, int kOTiles, class Softmax, class Kv>
__device__ __forceinline__ void store_o_packed(float (&o)[kOTiles][4], Softmax& softmax, const step4::QueryTileWork& w,
                                               int warp, const AttnParams& seq, const Kv& kv);

// Where the consumers find a query tile: its Q tile, the barrier that says it landed (and in which phase),
// and the K/V ring's use of its first K/V tile (the ring's index counts uses: slot and phase, ring.cuh).
// This kernel's block owns one tile: {sm.q, &sm.q_full, 0, 0}.
template <class T>
struct TileSlots {
  T* q;               // the [kPanels][Br, 64] Q tile; the epilogue stages O over it
  uint64_t* q_full;   // completes (phase q_parity) when Q has landed
  uint32_t q_parity;
  int first_use;      // the ring's use index of K/V tile 0
};

// One consumer warpgroup's main loop and epilogue; cw = 0 or 1 (run_consumer below decides whether it is a
// constant).
// p is the problem the tile's rows belong to (a packed batch's sequence, 7e); kv says where O and the LSE go:
// the dense layout, stored with TMA, or a packed batch's rows, one by one (kernel_7e_packed.cuh).
template <class Tr, class S, class Kv = step4::ContiguousKv>
__device__ __forceinline__ void consume_pingpong(S& sm, const CUtensorMap* tm_o, const AttnParams& p,
                                                 const step4::QueryTileWork& w, const TileSlots<typename Tr::T>& at,
                                                 const int cw, const Kv& kv = {}) {
  using T = typename Tr::T;
  const BlockTurns<Tr> turn{cw};
  constexpr int D = Tr::D, Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  constexpr int kSTiles = Bc / 8, kOTiles = D / 8;
  const step4::TmaRing<kStages> k_ring{sm.k_full, sm.k_empty}, v_ring{sm.v_full, sm.v_empty};
  const int warp = 4 * cw + threadIdx.x / 32 % 4;  // among the consumer warps: owns tile rows 16 warp .. + 15
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t q_rows = ptx::smem_u32(at.q) + Tr::QTile::offset(64 * cw, 0);
  const int row_g = w.m0 + 16 * warp + g;
  const step4::CausalMask mask(p);  // step 4's mask (mask.h); the tile test's rows: the warp's, within Q
  const step4::CausalMask::Span warp_rows = mask.span(w.m0 + 16 * warp, min(w.m0 + 16 * warp + 15, p.Nq - 1));
  const int N = w.n_tiles, i0 = at.first_use;  // K/V tile n is the ring's use i0 + n
  ptx::mbar_wait(at.q_full, at.q_parity);

  float o[kOTiles][4] = {};
  float s[kSTiles][4];
  uint32_t pa[Bc / 16][4];
  step4::RowSoftmax<kSTiles, kOTiles> softmax;
  float alpha[2];
  // S_n's mask (end of K, causal diagonal) and softmax; P_n stays in s until O may be touched.
  auto softmax_of = [&](int n) {
    const int key0 = n * Bc;
    if (mask.needs(warp_rows, key0, Bc)) step4::apply_mask(mask, s, row_g, row_g + 8, key0 + 2 * t);
#pragma unroll
    for (int r = 0; r < 2; ++r) alpha[r] = softmax.update_row(s, r, p.scale_log2);  // O is rescaled later
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) step4::acc_to_a<T>(pa[kk], s, kk);
  };

  if (N > 0) {  // ---- tile 0: S_0 alone --------------------------------------------------------------
    turn.wait();
    k_ring.wait(i0);
    wgmma_fence();
    warpgroup_qk<T, Br, Bc, D>(s, q_rows, ptx::smem_u32(sm.k[k_ring.slot(i0)]));
    wgmma_commit();
    turn.hand_over();
    wgmma_wait<0>();
    fence_regs(s);
    k_ring.release(i0);
    softmax_of(0);  // O is still zero: nothing to rescale
    pack_p();
  }
  for (int n = 1; n < N; ++n) {  // ---- S_n and P_{n-1} V_{n-1} in flight together ---------------------
    turn.wait();
    k_ring.wait(i0 + n);
    v_ring.wait(i0 + n - 1);
    wgmma_fence();  // o (rescaled) and pa (packed) were written by ordinary instructions
    warpgroup_qk<T, Br, Bc, D>(s, q_rows, ptx::smem_u32(sm.k[k_ring.slot(i0 + n)]));
    wgmma_commit();
    warpgroup_pv<T, Bc, D>(o, pa, ptx::smem_u32(sm.v[v_ring.slot(i0 + n - 1)]));
    wgmma_commit();
    turn.hand_over();
    wgmma_wait<1>();  // S_n has landed; P_{n-1} V_{n-1} may still run
    fence_regs(s);
    k_ring.release(i0 + n);
    softmax_of(n);
    wgmma_wait<0>();  // P_{n-1} V_{n-1} has landed: O and pa are ours again
    fence_regs(o);
    v_ring.release(i0 + n - 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) softmax.rescale_row(o, r, alpha[r]);
    pack_p();
  }
  if (N > 0) {  // ---- the last P V ----------------------------------------------------------------------
    v_ring.wait(i0 + N - 1);
    wgmma_fence();
    warpgroup_pv<T, Bc, D>(o, pa, ptx::smem_u32(sm.v[v_ring.slot(i0 + N - 1)]));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    v_ring.release(i0 + N - 1);
  }
  if constexpr (std::is_same_v<Kv, step4::ContiguousKv>)
    step4::store_o_rows<Tr>(o, softmax, at.q, tm_o, w.m0, w.bh, warp, p);  // a TMA box of 16 rows per warp
  else
    store_o_packed<Tr>(o, softmax, w, warp, p, kv);  // 7e: row by row, each at its sequence's place
}

// Consumer warpgroup wg - 1 runs consume_pingpong: with cw in a register (one copy of the loop in the
// binary), or, in one branch per warpgroup, with cw a constant the compiler folds in (a copy each; the turns'
// barrier ids become immediates). Which: the configuration's kOneLoopCopy (kernel_traits.h).
template <class Tr, class S, class Kv = step4::ContiguousKv>
__device__ __forceinline__ void run_consumer(S& sm, const CUtensorMap* tm_o, const AttnParams& p,
                                             const step4::QueryTileWork& w, const TileSlots<typename Tr::T>& at,
                                             const int wg, const Kv& kv = {}) {
  static_assert(Tr::kOneLoopCopy || Tr::kConsumerWarpgroups <= 2, "a copy per warpgroup is written out for two");
  if constexpr (Tr::kOneLoopCopy || Tr::kConsumerWarpgroups == 1) consume_pingpong<Tr>(sm, tm_o, p, w, at, wg - 1, kv);
  else if (wg == 1) consume_pingpong<Tr>(sm, tm_o, p, w, at, 0, kv);
  else consume_pingpong<Tr>(sm, tm_o, p, w, at, 1, kv);
}

// A block's work once its tile is known: barriers, then the roles (7b's producer, the ping-pong consumers).
// p: the problem the tile's rows belong to; kv: where the tiles lie and the outputs go (7e passes a packed
// batch's).
template <class Tr, class S, class Kv = step4::ContiguousKv>
__device__ __forceinline__ void run_block(S& sm, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                          const CUtensorMap* tm_v, const CUtensorMap* tm_o, const AttnParams& p,
                                          const step4::QueryTileWork& w, const int wg, const Kv& kv = {}) {
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.q_full, 1);
    step4::TmaRing<Tr::kStages>{sm.k_full, sm.k_empty}.init(Tr::kConsumerWarps);
    step4::TmaRing<Tr::kStages>{sm.v_full, sm.v_empty}.init(Tr::kConsumerWarps);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the barriers exist before anyone waits on them (the last block-wide barrier)
  if (wg == 0) {  // the producer, 7b's
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (threadIdx.x == 0) produce<Tr>(sm, tm_q, tm_k, tm_v, w, kv);
    return;
  }
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const TileSlots<typename Tr::T> at{sm.q, &sm.q_full, 0, 0};
  const BlockTurns<Tr> turns{wg - 1};
  turns.open();
  run_consumer<Tr>(sm, tm_o, p, w, at, wg, kv);
  turns.close();
}

// grid = ceil(Nq / Br) * Hq * B blocks, block = 384 threads (producer + two consumer warpgroups), or 256 (one,
// Br = 64; two blocks per SM).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kBlocksPerSM)
    forward_7c(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const AttnParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem<Tr>& sm = *reinterpret_cast<Smem<Tr>*>(step4::align_1024(smem_raw));
  // The warpgroup, broadcast from lane 0: ptxas then knows it is the same in every lane (warp-uniform) and keeps
  // what derives from it, the wgmma descriptors of this warpgroup's Q rows, in uniform registers (wgmma.cuh).
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const step4::QueryTileWork w(p, step4::CausalMask(p), Tr::Br, Tr::Bc, blockIdx.x);
  run_block<Tr>(sm, &tm_q, &tm_k, &tm_v, &tm_o, p, w, wg);
}

}  // namespace fa::step7
