// FlashAttention, step by step — step 4: compile-time tile configuration (step4_fused_pipelined/kernel_traits.h)
//
// One struct holds every size the kernel is built from; the static_asserts say why each constraint holds.
//   Br      query rows per block (the tile of Q that stays in registers)
//   Bc      keys per K/V tile (one trip of the main loop)
//   Warps   warps per block; each warp owns 16 query rows (one m16 tile of mma.sync)
//   Stages  K/V tiles in flight in the shared-memory ring (1 = no overlap, 2 = double buffering, ...)
#pragma once
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#include "common/ptx.h"
#endif

namespace fa::step4 {

// Shared memory one block may use on sm_120 (RTX 50-series): 99 KB with the opt-in attribute.
constexpr size_t kSm120SmemBytes = 99 * 1024;

template <typename T_, int D_, int Br_, int Bc_, int Warps_, int Stages_, bool Swizzle_ = true>
struct FwdTraits {
  using T = T_;
  static constexpr int D = D_, Br = Br_, Bc = Bc_, kWarps = Warps_, kStages = Stages_;
  static constexpr bool kSwizzle = Swizzle_;  // false: the ablation without the 128-byte swizzle
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPanelCols = 64;            // 64 x 16-bit = 128 bytes: one row of a swizzle panel
  static constexpr int kPanels = D / kPanelCols;   // a [rows, D] tile is stored as kPanels [rows, 64] panels

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(Br == 16 * kWarps, "each warp owns 16 query rows: one m16 tile of mma.m16n8k16");
  static_assert(D % kPanelCols == 0, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(D % 16 == 0, "Q K^T walks d in k16 steps of the mma");
  static_assert(Bc % 16 == 0, "P V walks keys in k16 steps, and K is read 16 keys per ldmatrix.x4");
  static_assert(Bc <= 256 && Br <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 K/V stages");

  // Registers per thread for the fragments (the rest is addresses and softmax state):
  // Q: D/16 k-steps x 4 regs, O: D/8 n-tiles x 4 floats, S: Bc/8 n-tiles x 4 floats.
  static constexpr int kFragRegs = D / 16 * 4 + D / 8 * 4 + Bc / 8 * 4;
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  static constexpr size_t kQBytes = size_t(Br) * D * sizeof(T);    // Q tile, later the O staging tile
  static constexpr size_t kKVBytes = size_t(Bc) * D * sizeof(T);   // one K (or V) tile
  static constexpr size_t kBarrierBytes = 8 * (1 + 4 * kStages);   // q_full, k/v_full, k/v_empty
  // Swizzled panels must start on 1024-byte boundaries; the dynamic shared base is only 16-byte aligned,
  // so 1024 bytes of slack are reserved for aligning it.
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep the panels 1024-byte aligned");

  static constexpr bool kFitsSm120 = kSmemBytes <= kSm120SmemBytes;

  // Byte offset of (row, 16-byte chunk) in a 1024-byte-aligned panel of 128-byte rows, laid out the way
  // the tensor map's TMA writes it: swizzled (common/ptx.h) or, for the ablation, plain row-major, where
  // the 8 rows an ldmatrix reads at one chunk all fall in the same 4 banks (an 8-way conflict).
  __device__ static uint32_t smem_offset(int row, int chunk);
};

#ifdef __CUDACC__
template <typename T_, int D_, int Br_, int Bc_, int Warps_, int Stages_, bool Swizzle_>
__device__ __forceinline__ uint32_t FwdTraits<T_, D_, Br_, Bc_, Warps_, Stages_, Swizzle_>::smem_offset(int row, int chunk) {
  return Swizzle_ ? ptx::swizzle_128b(row, chunk) : uint32_t(row * 128 + chunk * 16);
}
#endif

}  // namespace fa::step4
