// FlashAttention, step by step — step 7: compile-time tile configuration (step7_hopper_wgmma/kernel_traits.h)
//
// A configuration is named data, as in step 4 (step4_fused_pipelined/kernel_traits.h): HopperTiles says how big
// the tiles are and which of the chapter's designs runs them; HopperTraits derives the rest. The shared memory
// is step 4's FwdSmem (a Q tile, rings of K and V tiles, their barriers): step 7 changes who computes and who
// copies, not what lies in shared memory.
//   Br      query rows per block: 64 per consumer warpgroup (one m64 wgmma tile): 128, or at d = 64 also 64
//           (one warpgroup, two or three blocks per SM) and 192 (three warpgroups)
//   Bc      keys per K/V tile (the n of S = Q K^T, the k of O += P V)
//   stages  K/V tiles in shared memory at once
//   design  7a  kWgmma        step 4d's kernel with wgmma: every warpgroup computes, thread 0 also copies
//           7b  kSpecialized  a producer warpgroup copies, two consumer warpgroups compute (setmaxnreg)
//           7c  kPingPong     7b, with the consumers taking turns at the tensor cores and, within each, the
//                             next tile's Q K^T issued before this tile's softmax
//           7d  kPersistent   7c in blocks that stay resident, one per SM, and visit query tile after tile:
//                             the next tile's Q and K/V load while this tile's O is stored
//   blocks  blocks resident per SM; 0: the design's own (one, or two of 64 rows). Three blocks of 64 rows
//           share an SM's registers three ways: 136 per consumer thread, enough for 64-key tiles only
#pragma once
#include <cstddef>
#include <string>
#include <type_traits>

#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step7 {

enum class Design { kWgmma, kSpecialized, kPingPong, kPersistent };

struct HopperTiles {
  int Br = 128;
  int Bc = 128;
  int stages = 2;
  Design design = Design::kPingPong;
  int blocks = 0;
};

// "7c-Br128-Bc128-S2": what --variant and the configuration test call it.
inline std::string tiles_name(const HopperTiles& t) {
  const char* label = t.design == Design::kWgmma         ? "7a-"
                      : t.design == Design::kSpecialized ? "7b-"
                      : t.design == Design::kPingPong    ? "7c-"
                                                         : "7d-";
  // Appended piece by piece: on "text" + std::string, GCC 12 warns (-Wrestrict) about an overlap that cannot happen.
  std::string name = label;
  name += "Br", name += std::to_string(t.Br), name += "-Bc", name += std::to_string(t.Bc);
  name += "-S", name += std::to_string(t.stages);
  if (t.blocks) name += "-", name += std::to_string(t.blocks), name += "perSM";
  return name;
}

template <typename T_, int D_, HopperTiles kTiles>
struct HopperTraits {
  using T = T_;
  static constexpr int D = D_, Br = kTiles.Br, Bc = kTiles.Bc, kStages = kTiles.stages;
  static constexpr Design kDesign = kTiles.design;
  static constexpr step4::SmemLayout kLayout = step4::SmemLayout::kSwizzle;  // what TMA writes and wgmma reads
  static constexpr int kConsumerWarpgroups = Br / 64;  // each owns 64 query rows: one m64 wgmma tile
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr bool kProducerWarpgroup = kDesign != Design::kWgmma;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + (kProducerWarpgroup ? 1 : 0));
  using QTile = step4::PanelTile<Br, D>;   // the Q tile, later the O staging tile (step 4's panel_tile.h)
  using KVTile = step4::PanelTile<Bc, D>;  // one K (or V) tile
  static constexpr int kPanels = QTile::kPanels;  // a [rows, D] tile is kPanels [rows, 64] panels of 128-byte rows
  // Blocks per SM: one (of two or three consumer warpgroups), or two of one consumer warpgroup each (Br = 64):
  // then the two blocks' warpgroups share the tensor cores as 7c's two share them, without turns, and one
  // block's start and end run beside the other's products.
  // A third block of 64 rows (kTiles.blocks = 3) gives the SM a third consumer warpgroup, as FlashAttention 3's
  // three-warpgroup blocks do at d = 64, where the softmax's exp2 takes as long as the products.
  static constexpr int kBlocksPerSM = kTiles.blocks ? kTiles.blocks : Br == 64 ? 2 : 1;
  // Registers: a block starts with its share of the register file (65536 per SM), the same count for every
  // thread (a multiple of 8); then setmaxnreg moves what the producer gives up (it keeps 24 per thread) to
  // the consumers, rounded down to a multiple of 8. A block's total stays what it started with.
  static constexpr int kLaunchRegs = 65536 / kBlocksPerSM / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerShare = (kLaunchRegs + (kLaunchRegs - kProducerRegs) / kConsumerWarpgroups) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerShare < 256 ? kConsumerShare : 256;  // setmaxnreg's most
  // How many copies of the consumer loop the binary holds (kernel_7c_pingpong.cuh, run_consumer): one, which
  // every warpgroup runs with its index cw in a register, or one per warpgroup with cw a constant. At
  // d = 128 a copy is long enough that two running at once stall the warps on instruction fetch; at d = 64
  // two fit, and the constant index is faster (measured: docs/history/step7.md#one-copy-of-the-consumer-loop-log-row-15); three warpgroups (Br = 192)
  // keep one copy, as measured.
  static constexpr bool kOneLoopCopy = D == 128 || kConsumerWarpgroups == 3;

  static_assert(sizeof(T) == 2, "wgmma takes bf16 or fp16 operands here");
  static_assert(Br == 128 || ((Br == 64 || Br == 192) && kDesign == Design::kPingPong),
                "two consumer warpgroups of 64 rows; or, in 7c, one (no turns, two or three blocks per SM) or three");
  static_assert(kTiles.blocks == 0 || (Br == 64 && kTiles.blocks >= 2 && kTiles.blocks <= 3),
                "only blocks of 64 rows share an SM: two (the default) or three");
  static_assert(Bc == 64 || Bc == 128 || Bc == 176, "S = Q K^T is one wgmma of n = Bc: 64, 128 or 176 (wgmma.cuh)");
  static_assert(D == 64 || D == 128, "O += P V is one wgmma of n = D: 64 or 128 here (wgmma.cuh)");
  static_assert(kStages >= 2 && kStages <= 3, "a ring of 2 or 3 K/V stages");
  // The fragments a consumer thread holds: S (Bc/8 x 4 floats), O (D/8 x 4), P (Bc/16 x 4 registers).
  static_assert(Bc / 2 + D / 2 + Bc / 4 + 32 <= kConsumerRegs,
                "fragments and addresses must fit a consumer thread's registers (three blocks per SM: 64-key tiles)");

  static constexpr size_t kQBytes = QTile::kBytes, kKVBytes = KVTile::kBytes;
  static constexpr auto tiles = kTiles;  // the record it was made from (config_list.h, tiles_named)
  static std::string name() { return tiles_name(kTiles); }
};

// 7d's shared memory: step 4's with two Q tiles, so that the next query tile's Q lands while this one is
// computed (each is also where its O is staged), their barriers, and the index of the next tile.
template <class Tr>
struct PersistentSmem {
  using T = typename Tr::T;
  T q[2][Tr::Br * Tr::D];            // [2][kPanels][Br, 64]  query tiles used alternately
  T k[Tr::kStages][Tr::Bc * Tr::D];  // [kStages][kPanels][Bc, 64]  the K ring
  T v[Tr::kStages][Tr::Bc * Tr::D];  // the V ring
  uint64_t q_full[2], q_empty[2];    // Q tile i landed; every consumer warp's O has left it
  uint64_t k_full[Tr::kStages], v_full[Tr::kStages];
  uint64_t k_empty[Tr::kStages], v_empty[Tr::kStages];
  uint64_t tile_full[2], tile_empty[2];  // index slot i written; every consumer thread has read it
  int tile[2];                       // the block's query tiles k (slot k % 2), from the producer (kernel_7d_persistent.cuh)

  static constexpr size_t kBytes() { return step4::kSmemAlignSlack + sizeof(PersistentSmem); }
};

// The shared memory: step 4's forward layout (Q tile, K and V rings, mbarriers) at these tiles; 7d's above.
template <class Tr>
using Smem = std::conditional_t<Tr::kDesign == Design::kPersistent, PersistentSmem<Tr>, step4::FwdSmem<Tr>>;
template <class Tr>
constexpr size_t kSmemBytes = Smem<Tr>::kBytes();

}  // namespace fa::step7
