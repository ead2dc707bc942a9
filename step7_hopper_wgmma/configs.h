// FlashAttention, step by step — step 7: the named configurations (step7_hopper_wgmma/configs.h)
//
// One list per head dim, as in step 4 (step4_fused_pipelined/configs.h): the chapter's sub-steps 7a-7c at the
// default tiles, and the other tiles --variant can name. launch.cu compiles a kernel for each entry of `All`.
// Measured results: docs/history/step7.md.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "gpu/config_list.h"
#include "step7_hopper_wgmma/kernel_traits.h"

namespace fa::step7 {

// The chapter's sub-step `d` at the tiles of `tiles`.
constexpr HopperTiles substep(HopperTiles tiles, Design d) { return {tiles.Br, tiles.Bc, tiles.stages, d}; }

// Does each configuration's shared memory fit the H100: one block, and the blocks an SM holds at once?
template <class... Tr>
constexpr bool fit_h100(ConfigList<Tr...>) {
  return ((kSmemBytes<Tr> <= kSm90SmemBytes && Tr::kBlocksPerSM * (kSmemBytes<Tr> + 1024) <= 228 * 1024) && ...);
}

template <typename T, int D>
struct Configs {
  template <HopperTiles kTiles>
  using Fwd = HopperTraits<T, D, kTiles>;
  // The chapter's tiles: 128 x 128, two K/V stages: the sub-steps 7a-7d run on them.
  static constexpr HopperTiles kDefault{.Br = 128, .Bc = 128, .stages = 2, .design = Design::kPingPong};
  using Default = Fwd<kDefault>;
  // At d = 64 only: blocks of one consumer warpgroup (Br = 64), two per SM (kernel_traits.h, kBlocksPerSM).
  static constexpr HopperTiles kHalf{.Br = 64, .Bc = 128, .stages = 2};
  static constexpr HopperTiles kHalfLong{.Br = 64, .Bc = 176, .stages = 2};
  // Blocks of 64 rows with 64-key tiles: two per SM, or three (kernel_traits.h: then 136 registers a consumer
  // thread, which 64-key tiles fit). With a causal mask a narrower tile wastes less of the diagonal's.
  static constexpr HopperTiles kHalfNarrow{.Br = 64, .Bc = 64, .stages = 2};
  static constexpr HopperTiles kThirdNarrow{.Br = 64, .Bc = 64, .stages = 2, .blocks = 3};
  // At d = 64 only: three consumer warpgroups in one block (Br = 192, 512 threads; 160 registers a consumer
  // thread after setmaxnreg, enough for 128-key tiles), FlashAttention 3's tile at d = 64.
  static constexpr HopperTiles kThree{.Br = 192, .Bc = 128, .stages = 2};
  // The default depends on the head dim, the mask and the length of a query tile's work, Nk (measured on the
  // H100: docs/history/step7.md#the-default-as-it-changed-log-rows-7-11-13-17-26). Short rows are a few K/V trips, and the
  // start and end of each tile weigh most: 7d's persistent blocks hide them, with or without a mask at d = 128
  // (up to kShortKeys), and without one at d = 64 up to 1024 keys; with a causal mask at d = 64 three blocks of
  // 64 rows per SM hide them better, up to kThirdCausalKeys. Longer rows at d = 64 take three consumer
  // warpgroups in one block (Br = 192); at d = 128, 176-key tiles: fewer, longer trips.
  static constexpr int64_t kShortKeys = D == 128 ? 4096 : 1024;  // 7d up to here (d = 128: either mask; d = 64: none)
  static constexpr int64_t kThirdCausalKeys = 2048;              // d = 64 causal: three Br = 64 blocks up to here
  static constexpr HopperTiles kShort = substep(kDefault, Design::kPersistent);
  static constexpr HopperTiles kLong{.Br = 128, .Bc = 176, .stages = 2, .design = Design::kPingPong};
  static constexpr HopperTiles choose(bool causal, int64_t Nk) {
    if (D == 128) return Nk <= kShortKeys ? kShort : kLong;
    if (causal) return Nk <= kThirdCausalKeys ? kThirdNarrow : kThree;
    return Nk <= kShortKeys ? kShort : kThree;
  }
  // Every configuration --variant can name: the chapter's sub-steps at the default's tiles, other tiles.
  using Common = ConfigList<Fwd<substep(kDefault, Design::kWgmma)>, Fwd<substep(kDefault, Design::kSpecialized)>,
                            Default, Fwd<HopperTiles{.Br = 128, .Bc = 64, .stages = 2}>,  //
                            Fwd<HopperTiles{.Br = 128, .Bc = 128, .stages = 3}>,          //
                            Fwd<kLong>, Fwd<kShort>>;
  using All = std::conditional_t<D == 64, typename Append<Common, Fwd<kHalf>, Fwd<kHalfLong>, Fwd<kHalfNarrow>, Fwd<kThirdNarrow>, Fwd<kThree>>::type, Common>;
  static_assert(kSmemBytes<Fwd<kShort>> <= kSm90SmemBytes, "7d's second Q tile must fit beside the first and the K/V ring");
  static_assert(fit_h100(All{}), "every configuration fits the H100's shared memory: 227 KB per block, and its "
                                 "blocks per SM (two or three of 64 rows) 228 KB per SM with 1 KB reserved per block");
};

// The tiles (and design) of the configuration named `name`, or none (gpu/config_list.h): what launch.cu
// reads to tell the chapter's lessons from the rest.
inline std::optional<HopperTiles> tiles_named(const std::string& name) { return config_tiles_named<Configs>(name); }

}  // namespace fa::step7
