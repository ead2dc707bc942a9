// FlashAttention, step by step — step 7: the warpgroup tensor-core instructions of sm_90a
// (step7_hopper_wgmma/wgmma.cuh)
//
// What it adds: wgmma, the Hopper instruction that replaces mma.sync in step 7, and setmaxnreg, which moves
// registers between warps. Both exist only on sm_90a (the H100); sm_120 has neither, which is why steps 3-6
// use mma.sync (gpu/ptx.h).
//
// PTX ISA, "Asynchronous warpgroup level matrix multiply-accumulate instructions: wgmma.mma_async":
//   D[64 x N] (+)= A[64 x 16] * B[16 x N], issued by a warpgroup (4 consecutive warps, 128 threads) together.
//   A comes from shared memory (a matrix descriptor) or from registers; B always from shared memory. The
//   instruction is asynchronous: it returns at once, the tensor core reads shared memory and writes D in the
//   background; wgmma.commit_group closes the wgmmas issued so far into a group and wgmma.wait_group<N>
//   returns once at most N groups are pending. Until then D (and A in registers) must not be touched.
//   wgmma.fence orders earlier register writes (the softmax rescaling O, P packed into A) before the wgmma
//   that reads them.
// The accumulator layout: warp w of the warpgroup holds rows 16w .. 16w+15, and within them exactly what an
// mma.sync C fragment holds for each n8 column block (gpu/ptx.h): d[n8][0..1] = row g, cols 8n8 + 2t, +1;
// d[n8][2..3] = row g + 8. So step 4's softmax, mask and epilogue work on wgmma accumulators unchanged, and
// P packs into the A-from-registers operand exactly as acc_to_a packs it for mma.sync.
//
// A matrix descriptor (PTX ISA, "Matrix Descriptor Format") names a tile in shared memory: its start address,
// the swizzle (128 bytes: the layout TMA writes, fragments.cuh), and two strides in bytes:
//   K-major tile (Q and K: the reduction dim d contiguous): 8-row groups 1024 bytes apart (SBO); a k16 step
//     moves 32 bytes along a 128-byte row, the next 64 columns are the next panel.
//   MN-major tile (V in P V: the output dim d contiguous, keys are rows): a k16 step is 16 rows = 2048 bytes;
//     8-row groups 1024 bytes apart (SBO); the next 64 output columns are the next panel (LBO).
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "step4_fused_pipelined/panel_tile.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "step 7 uses wgmma and setmaxnreg: compile it for sm_90a (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace fa::step7 {

// ---- matrix descriptors ---------------------------------------------------------------------------
// Bits 0-13: start address / 16; 16-29: leading byte offset / 16; 32-45: stride byte offset / 16;
// 62-63: swizzle mode (1 = 128-byte swizzle). The base offset (bits 49-51) stays 0: panels are 1024-aligned.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t(1) << 62) | (uint64_t((sbo >> 4) & 0x3fff) << 32) | (uint64_t((lbo >> 4) & 0x3fff) << 16) |
         uint64_t((smem_addr >> 4) & 0x3fff);
}

// The same descriptor `bytes` further on (a multiple of 16): only the start address field changes, by
// bytes / 16, and it cannot carry into bit 14 (a shared-memory address is below 228 KB, so start / 16 < 2^14).
// One 32-bit add on the low word, where rebuilding a descriptor from its address costs a shift, two masks
// and an OR, and ptxas moves each result into a uniform register (7d's SASS: docs/history/step7.md#uniform-descriptors-log-rows-37-38).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

// ---- ordering -------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The compiler sees a wgmma's accumulators written when it is issued, not when wait_group returns: without
// this empty asm that "rewrites" them after the wait, it could move a read of them above the wait.
template <int NT>
__device__ __forceinline__ void fence_regs(float (&r)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int NK>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[NK][4]) {
#pragma unroll
  for (int i = 0; i < NK; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// ---- register reallocation ------------------------------------------------------------------------
// PTX ISA, "setmaxnreg": every warp of a warpgroup sets its register count to N (a multiple of 8, 24-256);
// registers a producer gives up become available to consumers that ask for more.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- the instructions -----------------------------------------------------------------------------
// Accumulator operands: "+f" for the four floats of each n8 block.
#define FA_ACC1(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define FA_ACC8(d, j)                                                                                            \
  FA_ACC1(d, j), FA_ACC1(d, j + 1), FA_ACC1(d, j + 2), FA_ACC1(d, j + 3), FA_ACC1(d, j + 4), FA_ACC1(d, j + 5), \
      FA_ACC1(d, j + 6), FA_ACC1(d, j + 7)
#define FA_D32                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_D64                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA_D88                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87}"
// SS: A and B from descriptors, both K-major (scale-a = scale-b = 1, no transpose); D = A B when !accumulate.
#define FA_WGMMA_SS(N, TY, DREGS, A, B, SCALE, ...)                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " DREGS ", " A ", " B ", p, 1, 1, 0, 0;\n}\n" \
               : __VA_ARGS__)
// RS: A from four registers per thread (an mma.sync A fragment per warp), B MN-major (transposed: tnsp-b = 1).
#define FA_WGMMA_RS(N, TY, DREGS, A, B, SCALE, ...)                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " DREGS ", " A ", " B ", p, 1, 1, 1;\n}\n" \
               : __VA_ARGS__)

// One wgmma of shape m64 x N x k16 for element type T (bf16 or fp16), fp32 accumulators d[N / 8][4].
template <typename T, int N>
struct Wgmma {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "wgmma here takes bf16 or fp16");
  static_assert(N == 64 || N == 128 || N == 176, "the shapes step 7 uses: n = 64, 128 or 176 (Bc for S, D for O)");
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;

  // d (+)= A B, A and B K-major in shared memory.
  __device__ __forceinline__ static void ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, bool accumulate) {
    const int scale = accumulate;
    if constexpr (N == 64 && kBf16)
      FA_WGMMA_SS(64, "bf16", FA_D32, "%32", "%33", "%34", FA_ACC8(d, 0) : "l"(a), "l"(b), "r"(scale));
    else if constexpr (N == 64)
      FA_WGMMA_SS(64, "f16", FA_D32, "%32", "%33", "%34", FA_ACC8(d, 0) : "l"(a), "l"(b), "r"(scale));
    else if constexpr (N == 128 && kBf16)
      FA_WGMMA_SS(128, "bf16", FA_D64, "%64", "%65", "%66", FA_ACC8(d, 0), FA_ACC8(d, 8) : "l"(a), "l"(b), "r"(scale));
    else if constexpr (N == 128)
      FA_WGMMA_SS(128, "f16", FA_D64, "%64", "%65", "%66", FA_ACC8(d, 0), FA_ACC8(d, 8) : "l"(a), "l"(b), "r"(scale));
    else if constexpr (kBf16)  // 176 = 22 n8 blocks
      FA_WGMMA_SS(176, "bf16", FA_D88, "%88", "%89", "%90", FA_ACC8(d, 0), FA_ACC8(d, 8), FA_ACC1(d, 16), FA_ACC1(d, 17),
                  FA_ACC1(d, 18), FA_ACC1(d, 19), FA_ACC1(d, 20), FA_ACC1(d, 21) : "l"(a), "l"(b), "r"(scale));
    else
      FA_WGMMA_SS(176, "f16", FA_D88, "%88", "%89", "%90", FA_ACC8(d, 0), FA_ACC8(d, 8), FA_ACC1(d, 16), FA_ACC1(d, 17),
                  FA_ACC1(d, 18), FA_ACC1(d, 19), FA_ACC1(d, 20), FA_ACC1(d, 21) : "l"(a), "l"(b), "r"(scale));
  }
  // d += A B, A from registers (O += P V: N = D, 64 or 128) (this thread's fragment of its warp's 16 rows), B MN-major in shared memory.
  __device__ __forceinline__ static void rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
    static_assert(N != 176, "O += P V has n = D");
    const int scale = 1;
    if constexpr (N == 64 && kBf16)
      FA_WGMMA_RS(64, "bf16", FA_D32, "{%32, %33, %34, %35}", "%36", "%37",
                  FA_ACC8(d, 0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale));
    else if constexpr (N == 64)
      FA_WGMMA_RS(64, "f16", FA_D32, "{%32, %33, %34, %35}", "%36", "%37",
                  FA_ACC8(d, 0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale));
    else if constexpr (kBf16)
      FA_WGMMA_RS(128, "bf16", FA_D64, "{%64, %65, %66, %67}", "%68", "%69",
                  FA_ACC8(d, 0), FA_ACC8(d, 8) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale));
    else
      FA_WGMMA_RS(128, "f16", FA_D64, "{%64, %65, %66, %67}", "%68", "%69",
                  FA_ACC8(d, 0), FA_ACC8(d, 8) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale));
  }
};
#undef FA_WGMMA_RS
#undef FA_WGMMA_SS
#undef FA_D88
#undef FA_D64
#undef FA_D32
#undef FA_ACC8
#undef FA_ACC1

// ---- the forward's two products, per warpgroup ------------------------------------------------------
// S [64, Bc] = Q K^T: this warpgroup's 64 rows of the Q tile (q_rows: their address in panel 0 of a tile of
// Rows rows) against the K tile [Bc, D] at k_base. Both are K-major, stored as D / 64 panels of 128-byte rows.
// Issues D / 16 wgmmas; the caller commits and waits.
template <typename T, int Rows, int Bc, int D>
__device__ __forceinline__ void warpgroup_qk(float (&s)[Bc / 8][4], uint32_t q_rows, uint32_t k_base) {
  using QPanels = step4::PanelLayout<Rows>;  // step 4's panel_tile.h
  using KPanels = step4::PanelLayout<Bc>;
  const uint64_t a0 = desc_sw128(q_rows, 16, 1024), b0 = desc_sw128(k_base, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t panel = kk / 4, col = (kk % 4) * 32;  // 64 columns per panel, 32 bytes per k16 step
    Wgmma<T, Bc>::ss(s, desc_advance(a0, QPanels::panel(panel) + col), desc_advance(b0, KPanels::panel(panel) + col), kk > 0);
  }
}
// O [64, D] += P V: P as A fragments in registers (pa, every k16 step of the Bc keys), V [Bc, D] at v_base,
// MN-major. Issues Bc / 16 wgmmas; the caller commits and waits.
template <typename T, int Bc, int D>
__device__ __forceinline__ void warpgroup_pv(float (&o)[D / 8][4], const uint32_t (&pa)[Bc / 16][4], uint32_t v_base) {
  const uint64_t b0 = desc_sw128(v_base, step4::PanelLayout<Bc>::kPanelBytes, 1024);  // next panel: Bc rows on
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) Wgmma<T, D>::rs(o, pa[kk], desc_advance(b0, step4::PanelLayout<Bc>::offset(16 * kk, 0)));
}

}  // namespace fa::step7
