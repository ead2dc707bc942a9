// FlashAttention, step by step — step 5: what both backward kernels share (step5_backward/device.cuh)
//
// The parameter block, the addressing of swizzled tiles for the three ldmatrix patterns, the
// accumulator-to-A-fragment repacking, and the dropout multiplier Z of one element.
//
// Operand conventions of mma.sync.m16n8k16 (common/ptx.h): A is [16 rows, k16] row-major, B is [k16, n8].
// A tile in shared memory is [rows, D] (rows = tokens, D = head dim), stored as D / 64 swizzled panels of
// [rows, 64]. From such a tile, ldmatrix gives
//   load_a        A fragments, rows = tile rows, k = head dim            (Q in step 4; K, V and Q, dO here)
//   load_b        B fragments, n = tile rows, k = head dim (no .trans)   (K in step 4's S = Q K^T)
//   load_b_trans  B fragments, k = tile rows, n = head dim (.trans)      (V in step 4's O += P V)
#pragma once
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

// Stores a warp's [16, D] fp32 accumulator tile (rows row0 + g, row0 + g + 8; columns 8nd + 2t, +1),
// times `mul`, as 16-bit pairs into the [N, D] matrix `out`; rows >= N are skipped. Every element of the
// tile is written by exactly one thread: no atomics, the same bits every run.
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* out, const float (&acc)[D / 8][4], int64_t row0, int64_t N, float mul) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= N) continue;
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + row * D + 2 * t);
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) dst[nd * 4] = ptx::pack2<T>(acc[nd][2 * r] * mul, acc[nd][2 * r + 1] * mul);
  }
}

}  // namespace fa::step5
