// FlashAttention, step by step — step 5: what both backward kernels share (step5_backward/device.cuh)
//
// The parameter block, the addressing of swizzled tiles for the three ldmatrix patterns, the
// accumulator-to-A-fragment repacking, the dropout multiplier Z of one element, and the schedule and Q/dO
// ring of a block that owns a tile of keys (the dK/dV and atomic kernels).
//
// Operand conventions of mma.sync.m16n8k16 (common/ptx.h): A is [16 rows, k16] row-major, B is [k16, n8].
// A tile in shared memory is [rows, D] (rows = tokens, D = head dim), stored as D / 64 swizzled panels of
// [rows, 64]. From such a tile, ldmatrix gives
//   load_a        A fragments, rows = tile rows, k = head dim            (Q in step 4; K, V and Q, dO here)
//   load_b        B fragments, n = tile rows, k = head dim (no .trans)   (K in step 4's S = Q K^T)
//   load_b_trans  B fragments, k = tile rows, n = head dim (.trans)      (V in step 4's O += P V)
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/dropout.h"
#include "common/gpu_runner.h"
#include "common/ptx.h"

namespace fa::step5 {

// What the backward kernels need, passed by value. Tensors are contiguous [B, H, N, d].
struct BwdParams {
  AttnParams a;      // the forward's problem: q, k, v, o, lse (written by the forward), shapes, mask, dropout
  const void* dout;  // dO [B, Hq, Nq, d]
  float* dsum;       // D = rowsum(dO * O) [B, Hq, Nq], written by the preprocess kernel
  void* dq;          // [B, Hq, Nq, d]
  float* dq_accum;   // atomic variant only: dQ / scale in fp32 [B, Hq, Nq, d], zeroed before the dK/dV kernel
  void* dk;          // [B, Hkv, Nk, d]
  void* dv;          // [B, Hkv, Nk, d]
};

constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of element (row, col) (col a multiple of 8) in a [Rows, D] tile of swizzled 64-column panels.
template <int Rows>
__device__ __forceinline__ uint32_t tile_offset(int row, int col) {
  return uint32_t((col / 64) * Rows * 128) + ptx::swizzle_128b(row, (col % 64) / 8);
}

// A fragment of rows row0 .. row0+15, head-dim columns 16kk .. 16kk+15. Lanes 0-15 address the rows at
// column 16kk (matrices 0, 1), lanes 16-31 the same rows at 16kk+8 (matrices 2, 3): a[0..3] as in ptx.h.
template <int Rows>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t base, int row0, int kk) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4(a, base + tile_offset<Rows>(row0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
}

// B fragments of two n8 tiles, n = tile rows n0 .. n0+7 (b[0], b[1]) and n0+8 .. n0+15 (b[2], b[3]),
// k = head-dim columns 16kk .. 16kk+15. Matrix m: rows n0 + 8 (m / 2), columns 16kk + 8 (m % 2).
template <int Rows>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], uint32_t base, int n0, int kk) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4(b, base + tile_offset<Rows>(n0 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8));
}

// B fragments of two n8 tiles, k = tile rows 16kk .. 16kk+15, n = head-dim columns n0 .. n0+7 (b[0], b[1])
// and n0+8 .. n0+15 (b[2], b[3]). Matrix m: rows 16kk + 8 (m % 2), columns n0 + 8 (m / 2), transposed.
template <int Rows>
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], uint32_t base, int kk, int n0) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4_trans(b, base + tile_offset<Rows>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
}

// The same three patterns as operands of a warp: a tile's base and the warp's first row (A, B) or head-dim
// column (B.trans), then fragments at compile-time steps i (rows or columns) and kk. Two ways to form the
// addresses, the same bytes (the atomic kernel's XorSteps, traits.h, picks):
//   plain      load_a / load_b / load_b_trans above: the whole swizzle at each load, left to the compiler.
//   XOR steps  this lane's first address once; because the 128-byte swizzle XORs the 16-byte chunk index
//              (address bits 4-6) with row % 8 and tiles start on 1024 bytes, a step of 8k rows is an add
//              (row % 8 unchanged) and a step of dcol columns inside a panel an XOR of those bits: one
//              instruction or none per ldmatrix, at the price of lane addresses held in registers. It needs
//              the first row to be a multiple of 8 and the first column's chunk bits disjoint from the
//              steps' (a multiple of a power of two larger than they are).
// Which is faster depends on the kernel's register pressure; measured per configuration (step5.md #20).
enum class Frag { kA, kB, kBTrans };
template <int Rows, Frag kFrag, bool kXorSteps>
struct Operand {
  uint32_t addr;  // with XOR steps, this lane's address of the first fragment; otherwise the tile's base
  int first;      // otherwise, the warp's first row or column
  __device__ __forceinline__ Operand(uint32_t base, int first_) : addr(base), first(first_) {
    const int lane = threadIdx.x % 32;
    if constexpr (kXorSteps && kFrag == Frag::kA)
      addr = base + uint32_t(first_ * 128) + tile_offset<Rows>(lane & 15, (lane >> 4) * 8);
    else if constexpr (kXorSteps && kFrag == Frag::kB)
      addr = base + uint32_t(first_ * 128) + tile_offset<Rows>((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
    else if constexpr (kXorSteps)
      addr = base + tile_offset<Rows>((lane & 7) + ((lane >> 3) & 1) * 8, first_ + (lane >> 4) * 8);
  }
  // A: rows first + i .. +15, k = 16kk; B: n = rows first + i .. +15, k = 16kk; B.trans: k = rows 16kk .. +15,
  // n = columns first + i .. +15.
  __device__ __forceinline__ void load(uint32_t (&f)[4], int i, int kk) const {
    if constexpr (!kXorSteps) {
      if constexpr (kFrag == Frag::kA) load_a<Rows>(f, addr, first + i, kk);
      else if constexpr (kFrag == Frag::kB) load_b<Rows>(f, addr, first + i, kk);
      else load_b_trans<Rows>(f, addr, kk, first + i);
    } else {
      const int drow = kFrag == Frag::kBTrans ? 16 * kk : i, dcol = kFrag == Frag::kBTrans ? i : 16 * kk;
      const uint32_t a = (addr ^ uint32_t((dcol % 64) / 8 << 4)) + uint32_t((dcol / 64) * Rows * 128 + drow * 128);
      if constexpr (kFrag == Frag::kBTrans) ptx::ldmatrix_x4_trans(f, a);
      else ptx::ldmatrix_x4(f, a);
    }
  }
};

// The fp32 C fragments of n8 tiles 2kk and 2kk+1 (16 rows x 16 columns) are, packed to 16 bits, exactly
// the A fragment of k16 step kk: step 4's P-to-A trick, no shared-memory round trip.
template <typename T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = ptx::pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = ptx::pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = ptx::pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = ptx::pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// Z of element (b, h, query i, key j): 0 if dropped, 1 / (1 - p) if kept (common/dropout.h). The word is
// picked with ?: so the four Philox words stay in registers (w.v[j & 3] would go through local memory).
__device__ __forceinline__ float dropout_z(const DropoutParams& dp, int b, int h, int i, int j) {
  const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j) >> 2);
  const uint32_t lo = j & 1 ? w.v[1] : w.v[0], hi = j & 1 ? w.v[3] : w.v[2];
  return (j & 2 ? hi : lo) >= dp.threshold ? dp.keep_scale : 0.0f;
}

// Z of keys j and j + 1 (j even) of one row: both fall in one group of four keys, so one Philox call
// serves the pair (words 0, 1 for j % 4 == 0, words 2, 3 for j % 4 == 2), as in step 4's forward.
__device__ __forceinline__ void dropout_z2(const DropoutParams& dp, int b, int h, int i, int j, float& z0, float& z1) {
  const auto w = dropout_words(dp.seed, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j) >> 2);
  const bool odd = j & 2;
  z0 = (odd ? w.v[2] : w.v[0]) >= dp.threshold ? dp.keep_scale : 0.0f;
  z1 = (odd ? w.v[3] : w.v[1]) >= dp.threshold ? dp.keep_scale : 0.0f;
}

// True when some element of the tile [q0, q0 + rows) x [k0, k0 + cols) is masked: a query past Nq, a key
// past Nk, or (causal) a key above the diagonal. Only such tiles pay for the per-element mask, as in
// step 4; in every other tile each row sees a key, so its LSE is finite.
__device__ __forceinline__ bool tile_needs_mask(const AttnParams& p, int q0, int rows, int k0, int cols) {
  return q0 + rows > p.Nq || k0 + cols > p.Nk || (p.causal && int64_t(k0) + cols - 1 > p.input_pos + q0);
}

// Stores a warp's [16, 8 NT] fp32 accumulator tile (rows row0 + g, row0 + g + 8; columns col0 + 8nd + 2t,
// +1), times `mul`, as 16-bit pairs into the [N, D] matrix `out`; rows >= N are skipped. Every element of
// the tile is written by exactly one thread: no atomics, the same bits every run.
template <typename T, int D, int NT>
__device__ __forceinline__ void store_rows(T* out, const float (&acc)[NT][4], int64_t row0, int64_t N, float mul,
                                           int col0 = 0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= N) continue;
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + row * D + col0 + 2 * t);
#pragma unroll
    for (int nd = 0; nd < NT; ++nd) dst[nd * 4] = ptx::pack2<T>(acc[nd][2 * r] * mul, acc[nd][2 * r + 1] * mul);
  }
}

// The work of a block that owns the Bc keys k0 .. k0 + Bc - 1 of one KV head (the dK/dV kernel, the atomic
// kernel). Key tiles of one head are neighbours in the grid. The block visits the query tiles of Bq rows
// that see its keys, for every query head of its GQA group: all of them, or (causal) those from the first
// row whose diagonal reaches key k0 (row i sees key j iff j <= input_pos + i). Iteration `it` is query
// tile q0(it) / Bq of query head head(it). With `rotate`, the block starts that list at its own key tile's
// index (mod n_iter) and wraps around: the blocks of one head, which run side by side, then add their dQ
// into different rows at any one time (the atomic kernel). The order is fixed per block, so dK and dV
// are still summed in the same order every run.
struct KeyBlockWork {
  int b, hkv, bh_kv, k0;           // batch, KV head, their flat index, first key
  int m_first, per_head, n_iter;  // first query tile, tiles per query head, iterations in all
  int group, Bq, rot = 0;         // GQA group size, query tile height, first iteration's place

  __device__ KeyBlockWork(const AttnParams& p, int Bc, int Bq_, bool rotate = false) : group(p.group), Bq(Bq_) {
    const int num_n = (p.Nk + Bc - 1) / Bc;
    bh_kv = blockIdx.x / num_n;
    hkv = bh_kv % p.Hkv;
    b = bh_kv / p.Hkv;
    k0 = (blockIdx.x % num_n) * Bc;
    const int num_m = (p.Nq + Bq - 1) / Bq;
    m_first = 0;
    if (p.causal) {
      const int64_t first_row = max(int64_t(0), int64_t(k0) - p.input_pos);
      m_first = first_row >= p.Nq ? num_m : int(first_row / Bq);
    }
    per_head = num_m - m_first;
    n_iter = per_head * group;
    if (rotate && n_iter > 0) rot = (blockIdx.x % num_n) % n_iter;
  }
  __device__ int order(int it) const { return it + rot < n_iter ? it + rot : it + rot - n_iter; }  // place in the list
  __device__ int head(int it) const { return hkv * group + order(it) / per_head; }   // query head of iteration it
  __device__ int q0(int it) const { return (m_first + order(it) % per_head) * Bq; }  // its first query row
};

// The Q/dO ring of a key block: kStages slots of a Q tile and a dO tile ([kPanels][Bq, 64] each), a `full`
// barrier per slot (TMA's bytes landed) and an `empty` one (every warp is done reading, count kWarps).
// One thread, the producer, issues every copy: iteration it's tiles go into slot it % kStages.
template <class Tr>
struct QdoRing {
  using T = typename Tr::T;
  static constexpr int kStages = Tr::kStages;
  T* sQ;                // [kStages][kPanels][Bq, 64]
  T* sdO;               // [kStages][kPanels][Bq, 64]
  uint64_t* full;       // [kStages]
  uint64_t* empty;      // [kStages]
  const CUtensorMap* tm_q;
  const CUtensorMap* tm_do;

  __device__ T* q(int it) const { return sQ + (it % kStages) * Tr::kPanels * Tr::Bq * 64; }
  __device__ T* dout(int it) const { return sdO + (it % kStages) * Tr::kPanels * Tr::Bq * 64; }
  // Phase parity of the use of slot it % kStages by iteration it (one completion per use).
  __device__ static uint32_t parity(int it) { return uint32_t(it / kStages) & 1; }

  __device__ void init() const {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], Tr::kWarps);
    }
  }
  __device__ void load(const KeyBlockWork& w, int Hq, int it) const {
    uint64_t* bar = &full[it % kStages];
    const int bh_q = w.b * Hq + w.head(it), q0 = w.q0(it);
    ptx::mbar_arrive_expect_tx(bar, 2 * Tr::kQBytes);
#pragma unroll
    for (int c = 0; c < Tr::kPanels; ++c) {
      ptx::tma_load_3d(q(it) + c * Tr::Bq * 64, tm_q, c * 64, q0, bh_q, bar);
      ptx::tma_load_3d(dout(it) + c * Tr::Bq * 64, tm_do, c * 64, q0, bh_q, bar);
    }
  }
  // The producer, in iteration n >= 1: tiles of iteration n + kStages - 1 into the slot of iteration n - 1,
  // once every warp has released it (at the end of its iteration n - 1).
  __device__ void refill(const KeyBlockWork& w, int Hq, int n) const {
    if (threadIdx.x == 0 && n >= 1 && n + kStages - 1 < w.n_iter) {
      ptx::mbar_wait(&empty[(n - 1) % kStages], parity(n - 1));
      load(w, Hq, n + kStages - 1);
    }
  }
  __device__ void wait(int it) const { ptx::mbar_wait(&full[it % kStages], parity(it)); }
  // Every lane's ldmatrix reads of the slot are done (__syncwarp) before one lane releases it for the warp.
  __device__ void release(int it) const {
    __syncwarp();
    if (threadIdx.x % 32 == 0) ptx::mbar_arrive(&empty[it % kStages]);
  }
};

}  // namespace fa::step5
