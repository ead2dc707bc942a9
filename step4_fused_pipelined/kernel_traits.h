// FlashAttention, step by step — step 4: compile-time tile configuration (step4_fused_pipelined/kernel_traits.h)
//
// A configuration is named data: FwdTiles says, by name, how big the tiles are; FwdTraits derives every
// other size from it (the static_asserts say why each constraint holds); FwdSmem declares the kernel's
// shared memory as a type, so the pointers the kernel uses and the byte count the launch asks for come
// from one declaration.
//   Br      query rows per block (the tile of Q that stays in registers); 16 per warp
//   Bc      keys per K/V tile (one trip of the main loop)
//   stages  K/V tiles in shared memory at once (1 = no overlap, 2 = double buffering, ...)
//   layout  how a tile's rows sit in shared memory (fragments.cuh): padded, 128-byte swizzle, or plain
//   copy    who copies tiles into shared memory: the chapter's sub-steps 4a-4d differ in layout and copy
//     4a  copy = kThreads, layout = kPadded   the threads copy, then __syncthreads; padded rows (kernel_4a)
//     4b  copy = kThreads, layout = kSwizzle  the same kernel; the swizzle instead of padding
//     4c  copy = kCpAsync                     asynchronous copies of tile j+1 during tile j (kernel_4c)
//     4d  copy = kTma                         TMA into a ring of mbarrier-guarded stages (kernel_4d)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/gpu_types.h"
#include "step4_fused_pipelined/panel_tile.h"

namespace fa::step4 {
// Who copies the tiles from global into shared memory.
enum class TileCopy {
  kThreads,  // every thread loads 16-byte chunks into registers and stores them (4a, 4b)
  kCpAsync,  // every thread issues cp.async, which copies without registers while it computes (4c)
  kTma,      // one thread issues TMA bulk copies; mbarriers say when they landed (4d, the default)
};

// The order of the blocks (scheduler.cuh): query tiles of one head are neighbours (the default), or
// heads are (the ablation).
enum class TileOrder { kTileFast, kHeadFast };

struct FwdTiles {
  int Br = 64;
  int Bc = 64;
  int stages = 2;
  SmemLayout layout = SmemLayout::kSwizzle;
  TileCopy copy = TileCopy::kTma;
  bool head_fast = false;  // the block-order ablation (scheduler.cuh, TileOrder::kHeadFast)
  bool split_kv = false;   // 4f: split-KV decoding (kernel_4f_split_kv.cuh), a TMA kernel
};

// "Br64-Bc64-W4-S2" (4d, TMA), "4a-Br64-Bc64-W4-padded", "4c-Br64-Bc64-W4-S2": what --variant and step 6's
// tuner call the configuration of these tiles.
inline std::string tiles_name(const FwdTiles& t) {
  const std::string label = t.split_kv ? "4f-"
                            : t.copy == TileCopy::kTma ? ""
                            : t.copy == TileCopy::kCpAsync ? "4c-"
                            : t.layout == SmemLayout::kPadded ? "4a-" : "4b-";
  const std::string layout = t.layout == SmemLayout::kPadded ? "-padded"
                             : t.layout == SmemLayout::kPlain ? "-noswizzle" : "";
  return label + "Br" + std::to_string(t.Br) + "-Bc" + std::to_string(t.Bc) + "-W" + std::to_string(t.Br / 16) +
         (t.copy == TileCopy::kThreads ? "" : "-S" + std::to_string(t.stages)) + layout +
         (t.head_fast ? "-headfast" : "");
}

// The alignment slack of every kernel with swizzled tiles: fragments.cuh's align_1024 moves the dynamic
// shared-memory base (only 16-byte aligned) to the 1024 bytes the swizzle pattern repeats over.
constexpr size_t kSmemAlignSlack = 1024;

template <typename T_, int D_, FwdTiles kTiles>
struct FwdTraits {
  using T = T_;
  static constexpr int D = D_, Br = kTiles.Br, Bc = kTiles.Bc, kStages = kTiles.stages;
  static constexpr SmemLayout kLayout = kTiles.layout;
  static constexpr TileCopy kCopy = kTiles.copy;
  static constexpr TileOrder kOrder = kTiles.head_fast ? TileOrder::kHeadFast : TileOrder::kTileFast;
  static constexpr bool kSplitKv = kTiles.split_kv;
  // Score modifiers (score_mod.cuh) are compiled into the TMA kernels with swizzled tiles in the default
  // block order, the ones a user runs and step 6 tunes; the chapter's lessons and ablations run without.
  static constexpr bool kHasMods = kCopy == TileCopy::kTma && kLayout == SmemLayout::kSwizzle && !kTiles.head_fast;
  static constexpr int kWarps = Br / 16;           // each warp owns 16 query rows: one m16 tile of mma.sync
  static constexpr int kThreads = 32 * kWarps;
  using QTile = PanelTile<Br, D, kLayout>;         // the Q tile, later the O staging tile (panel_tile.h)
  using KVTile = PanelTile<Bc, D, kLayout>;        // one K (or V) tile
  static constexpr int kPanels = QTile::kPanels;   // a [rows, D] tile is stored as kPanels [rows, 64] panels

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(Br % 16 == 0, "each warp owns 16 query rows: one m16 tile of mma.m16n8k16");
  static_assert(D % 16 == 0, "Q K^T walks d in k16 steps of the mma");
  static_assert(Bc % 16 == 0, "P V walks keys in k16 steps, and K is read 16 keys per ldmatrix.x4");
  static_assert(Bc <= 256 && Br <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 1 && kStages <= 4, "1 to 4 K/V stages");
  static_assert(kCopy != TileCopy::kThreads || kStages == 1, "4a/4b copy, then compute: one K/V buffer");
  static_assert(kCopy != TileCopy::kCpAsync || kStages == 2, "4c double-buffers: tile j+1 lands while j is used");
  static_assert(kCopy != TileCopy::kTma || kLayout != SmemLayout::kPadded, "TMA writes dense rows, never padded ones");
  static_assert(!kSplitKv || (kCopy == TileCopy::kTma && kLayout == SmemLayout::kSwizzle && !kTiles.head_fast),
                "4f is 4d's kernel (TMA, swizzled tiles) with split-KV");

  // Registers per thread for the fragments (the rest is addresses and softmax state):
  // Q: D/16 k-steps x 4 regs, O: D/8 n-tiles x 4 floats, S: Bc/8 n-tiles x 4 floats.
  static constexpr int kFragRegs = D / 16 * 4 + D / 8 * 4 + Bc / 8 * 4;
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  static constexpr size_t kQBytes = QTile::kBytes, kKVBytes = KVTile::kBytes;
  static_assert(QTile::kKeepsAlignment && KVTile::kKeepsAlignment, "tiles must keep the panels 1024-byte aligned");

  static constexpr auto tiles = kTiles;  // the record it was made from (config_list.h, tiles_named)
  static std::string name() { return tiles_name(kTiles); }
};

// The forward kernel's shared memory, in address order from the 1024-byte-aligned base. Every tile is a
// multiple of 1024 bytes, so every panel stays 1024-byte aligned.
template <class Tr>
struct FwdSmem {
  using T = typename Tr::T;
  T q[Tr::QTile::kBytes / sizeof(T)];               // Tr::QTile; at the end each warp stages its O rows here
  T k[Tr::kStages][Tr::KVTile::kBytes / sizeof(T)];  // [kStages] x Tr::KVTile  the K ring
  T v[Tr::kStages][Tr::KVTile::kBytes / sizeof(T)];  // [kStages] x Tr::KVTile  the V ring
  uint64_t q_full;                       // Q tile landed
  uint64_t k_full[Tr::kStages], v_full[Tr::kStages];    // K (V) tile of the slot landed
  uint64_t k_empty[Tr::kStages], v_empty[Tr::kStages];  // every warp is done reading the slot

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(FwdSmem); }
};

// The shared memory of the kernels whose threads copy the tiles (4a-4c): tiles only, no barriers.
template <class Tr>
struct CopySmem {
  uint8_t q[Tr::QTile::kBytes];                // Tr::QTile: [kPanels][Br, 64 (+ padding)]
  uint8_t k[Tr::kStages][Tr::KVTile::kBytes];  // [kStages] x Tr::KVTile
  uint8_t v[Tr::kStages][Tr::KVTile::kBytes];

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(CopySmem); }
};

// Dynamic shared memory of configuration Tr, alignment slack included.
template <class Tr>
constexpr size_t kFwdSmemBytes = Tr::kCopy == TileCopy::kTma ? FwdSmem<Tr>::kBytes() : CopySmem<Tr>::kBytes();

}  // namespace fa::step4
