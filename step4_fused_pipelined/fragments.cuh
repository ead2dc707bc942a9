// FlashAttention, step by step — step 4: swizzled tiles and the fragment loaders
// (step4_fused_pipelined/fragments.cuh)
//
// What it adds: how a [rows, D] tile in shared memory becomes mma.sync fragments.
// A tile is stored as D / 64 panels of [rows, 64] 16-bit elements (128-byte rows). Shared memory has 32
// banks of 4 bytes; an ldmatrix reads eight 16-byte rows at once, and is conflict-free when those eight
// rows cover all 32 banks. Stored plainly (SmemLayout::kPlain, the ablation), eight rows 128 bytes apart
// start in the same bank: an 8-way conflict. Two cures (kernel_traits.h, SmemLayout):
//   padded (4a)   each row takes 144 bytes, so row r starts 4r banks further on: 1/8 more memory;
//   swizzled      the 16-byte chunk c of row r is stored at chunk c ^ (r % 8) (CUDA programming guide,
//   (4b-4d)       "tensor memory access", CU_TENSOR_MAP_SWIZZLE_128B): no extra memory, and TMA writes it.
//
// Operand conventions of mma.sync.m16n8k16 (gpu/ptx.h): A is [16 rows, k16] row-major, B is [k16, n8].
// From a tile, ldmatrix.x4 gives
//   load_a        A fragments, rows = tile rows, k = head dim            (Q in S = Q K^T)
//   load_b        B fragments, n = tile rows, k = head dim (no .trans)   (K in S = Q K^T)
//   load_b_trans  B fragments, k = tile rows, n = head dim (.trans)      (V in O += P V)
// and acc_to_a turns fp32 C fragments into the A fragment of the next product (P in O += P V) without a
// trip through shared memory; warp_qk and warp_pv are a warp's two products of the forward, built on them.
// Step 5 reads every operand of the backward with the loaders.
#pragma once
#include <cstdint>

#include "gpu/ptx.h"
#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step4 {

// The swizzle is computed from address bits, so swizzled tiles must start on 1024 bytes; the dynamic
// shared-memory base is only 16-byte aligned, hence kSmemAlignSlack (kernel_traits.h) in every budget and this.
__device__ __forceinline__ uint8_t* align_1024(uint8_t* smem_raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// Byte offset of element (row, col), col a multiple of 8, in a [Rows, D] tile of 64-column panels
// (panel_tile.h: panel col / 64, then row and chunk inside it, the chunk XORed with row % 8 when swizzled).
template <int Rows, SmemLayout L = SmemLayout::kSwizzle>
__device__ __forceinline__ uint32_t tile_offset(int row, int col) {
  return PanelLayout<Rows, L>::offset(row, col);
}

// A fragment of rows row0 .. row0+15, head-dim columns 16kk .. 16kk+15. Lanes 0-15 address the rows at
// column 16kk (matrices 0, 1), lanes 16-31 the same rows at 16kk+8 (matrices 2, 3): a[0..3] as in ptx.h.
template <int Rows, SmemLayout L = SmemLayout::kSwizzle>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t base, int row0, int kk) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4(a, base + tile_offset<Rows, L>(row0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
}

// B fragments of two n8 tiles, n = tile rows n0 .. n0+7 (b[0], b[1]) and n0+8 .. n0+15 (b[2], b[3]),
// k = head-dim columns 16kk .. 16kk+15. Matrix m: rows n0 + 8 (m / 2), columns 16kk + 8 (m % 2).
template <int Rows, SmemLayout L = SmemLayout::kSwizzle>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], uint32_t base, int n0, int kk) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4(b, base + tile_offset<Rows, L>(n0 + (lane & 7) + (lane >> 4) * 8,
                                                         kk * 16 + ((lane >> 3) & 1) * 8));
}

// B fragments of two n8 tiles, k = tile rows 16kk .. 16kk+15, n = head-dim columns n0 .. n0+7 (b[0], b[1])
// and n0+8 .. n0+15 (b[2], b[3]). Matrix m: rows 16kk + 8 (m % 2), columns n0 + 8 (m / 2), transposed.
template <int Rows, SmemLayout L = SmemLayout::kSwizzle>
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], uint32_t base, int kk, int n0) {
  const int lane = threadIdx.x % 32;
  ptx::ldmatrix_x4_trans(b, base + tile_offset<Rows, L>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                               n0 + (lane >> 4) * 8));
}

// The fp32 C fragments of n8 tiles 2kk and 2kk+1 (16 rows x 16 columns) are, packed to 16 bits, exactly
// the A fragment of k16 step kk (the C and A layouts of ptx.h line up): P goes from S's accumulators
// straight into O += P V.
template <typename T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = ptx::pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = ptx::pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = ptx::pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = ptx::pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// One ldmatrix.x4 of B holds the fragments of two n8 tiles (16 columns): c[2np] += a b[0..1] and
// c[2np + 1] += a b[2..3], one mma each. Every product of the course's mma.sync kernels is made of these.
template <typename T, int N>
__device__ __forceinline__ void mma_two_n8(float (&c)[N][4], int np, const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  ptx::mma_16816<T>(c[2 * np], a, {b[0], b[1]});
  ptx::mma_16816<T>(c[2 * np + 1], a, {b[2], b[3]});
}

// C [16, 8 NT] += A B for one warp, the pattern of both of the forward's products: A in registers (a, one
// fragment per k16 step), B from shared memory, two n8 tiles per load: load(b, kk, np) fills b with the B
// fragments of k16 step kk and columns 16 np .. 16 np + 15.
template <typename T, int KSteps, int NT, class LoadB>
__device__ __forceinline__ void warp_mma(float (&c)[NT][4], const uint32_t (&a)[KSteps][4], LoadB&& load) {
#pragma unroll
  for (int kk = 0; kk < KSteps; ++kk)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load(b, kk, np);
      mma_two_n8<T>(c, np, a[kk], b);
    }
}

// S [16, Bc] += Q K^T: Q's rows as A fragments (qa, every k16 step of d) against the K tile [Bc, D] at k_base.
// For S = Q K^T, B[k][n] = K[key n][dim k]: a plain ldmatrix.x4 of key rows gives the B fragments of two n8
// tiles (16 keys).
template <typename T, int Bc, int D, SmemLayout L>
__device__ __forceinline__ void warp_qk(float (&s)[Bc / 8][4], const uint32_t (&qa)[D / 16][4], uint32_t k_base) {
  warp_mma<T>(s, qa, [&](uint32_t (&kb)[4], int kk, int np) { load_b<Bc, L>(kb, k_base, np * 16, kk); });
}

// O [16, D] += P V: P as A fragments (pa, every k16 step of the Bc keys) against the V tile [Bc, D] at v_base.
// V's rows are keys (the k dimension), so ldmatrix.trans turns them into B fragments.
template <typename T, int Bc, int D, SmemLayout L>
__device__ __forceinline__ void warp_pv(float (&o)[D / 8][4], const uint32_t (&pa)[Bc / 16][4], uint32_t v_base) {
  warp_mma<T>(o, pa, [&](uint32_t (&vb)[4], int kk, int np) { load_b_trans<Bc, L>(vb, v_base, kk, np * 16); });
}

}  // namespace fa::step4
