// FlashAttention, step by step — step 4: compile-time tile configuration (step4_fused_pipelined/kernel_traits.h)
//
// A configuration is named data: FwdTiles says, by name, how big the tiles are; FwdTraits derives every
// other size from it (the static_asserts say why each constraint holds); FwdSmem declares the kernel's
// shared memory as a type, so the pointers the kernel uses and the byte count the launch asks for come
// from one declaration.
//   Br      query rows per block (the tile of Q that stays in registers); 16 per warp
//   Bc      keys per K/V tile (one trip of the main loop)
//   stages  K/V tiles in flight in the shared-memory ring (1 = no overlap, 2 = double buffering, ...)
//   swizzle the 128-byte swizzle (false: the ablation with plain rows, fragments.cuh)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/gpu_types.h"

namespace fa::step4 {

struct FwdTiles {
  int Br = 64;
  int Bc = 64;
  int stages = 2;
  bool swizzle = true;
};

// The alignment slack of every kernel with swizzled tiles: fragments.cuh's align_1024 moves the dynamic
// shared-memory base (only 16-byte aligned) to the 1024 bytes the swizzle pattern repeats over.
constexpr size_t kSmemAlignSlack = 1024;

template <typename T_, int D_, FwdTiles kTiles>
struct FwdTraits {
  using T = T_;
  static constexpr int D = D_, Br = kTiles.Br, Bc = kTiles.Bc, kStages = kTiles.stages;
  static constexpr bool kSwizzle = kTiles.swizzle;
  static constexpr int kWarps = Br / 16;           // each warp owns 16 query rows: one m16 tile of mma.sync
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPanelCols = 64;            // 64 x 16-bit = 128 bytes: one row of a swizzle panel
  static constexpr int kPanels = D / kPanelCols;   // a [rows, D] tile is stored as kPanels [rows, 64] panels

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(Br % 16 == 0, "each warp owns 16 query rows: one m16 tile of mma.m16n8k16");
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
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep the panels 1024-byte aligned");

  // "Br64-Bc64-W4-S2": what --variant and step 6's tuner call this configuration.
  static std::string name() {
    return "Br" + std::to_string(Br) + "-Bc" + std::to_string(Bc) + "-W" + std::to_string(kWarps) + "-S" +
           std::to_string(kStages) + (kSwizzle ? "" : "-noswizzle");
  }
};

// The forward kernel's shared memory, in address order from the 1024-byte-aligned base. Every tile is a
// multiple of 1024 bytes, so every panel stays 1024-byte aligned.
template <class Tr>
struct FwdSmem {
  using T = typename Tr::T;
  T q[Tr::Br * Tr::D];                   // [kPanels][Br, 64]; at the end each warp stages its O rows here
  T k[Tr::kStages][Tr::Bc * Tr::D];      // [kStages][kPanels][Bc, 64]  the K ring
  T v[Tr::kStages][Tr::Bc * Tr::D];      // [kStages][kPanels][Bc, 64]  the V ring
  uint64_t q_full;                       // Q tile landed
  uint64_t k_full[Tr::kStages], v_full[Tr::kStages];    // K (V) tile of the slot landed
  uint64_t k_empty[Tr::kStages], v_empty[Tr::kStages];  // every warp is done reading the slot

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(FwdSmem); }
};

// Dynamic shared memory of configuration Tr, alignment slack included.
template <class Tr>
constexpr size_t kFwdSmemBytes = FwdSmem<Tr>::kBytes();

}  // namespace fa::step4
