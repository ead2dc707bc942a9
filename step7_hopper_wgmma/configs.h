// FlashAttention, step by step — step 7: the named configurations (step7_hopper_wgmma/configs.h)
//
// One list per head dim, as in step 4 (step4_fused_pipelined/configs.h): the chapter's sub-steps 7a-7c at the
// default tiles, and the other tiles --variant can name. launch.cu compiles a kernel for each entry of `All`.
// Measured results: docs/results/step7.md.
#pragma once
#include <cstdint>

#include "gpu/config_list.h"
#include "step7_hopper_wgmma/kernel_traits.h"

namespace fa::step7 {

// The chapter's sub-step `d` at the tiles of `tiles`.
constexpr HopperTiles substep(HopperTiles tiles, Design d) { return {tiles.Br, tiles.Bc, tiles.stages, d}; }

template <typename T, int D>
struct Configs {
  template <HopperTiles kTiles>
  using Fwd = HopperTraits<T, D, kTiles>;
  // The chapter's tiles: 128 x 128, two K/V stages; sub-step 7c on them is the default with a causal mask.
  static constexpr HopperTiles kDefault{.Br = 128, .Bc = 128, .stages = 2, .design = Design::kPingPong};
  using Default = Fwd<kDefault>;
  // Without a mask the default depends on the length of a query tile's work, Nk (measured on the H100:
  // docs/results/step7.md): up to kShortKeys keys a tile is a few K/V trips, and the start and end of each
  // tile weigh most, which 7d's persistent blocks hide; longer rows take 176-key tiles (fewer, longer trips).
  static constexpr int64_t kShortKeys = 2048;
  static constexpr HopperTiles kShort = substep(kDefault, Design::kPersistent);
  static constexpr HopperTiles kLong{.Br = 128, .Bc = 176, .stages = 2, .design = Design::kPingPong};
  static constexpr HopperTiles choose(bool causal, int64_t Nk) {
    return causal ? kDefault : Nk <= kShortKeys ? kShort : kLong;
  }
  // Every configuration --variant can name: the chapter's sub-steps at the default's tiles, other tiles.
  using All = ConfigList<Fwd<substep(kDefault, Design::kWgmma)>, Fwd<substep(kDefault, Design::kSpecialized)>, Default,
                         Fwd<HopperTiles{.Br = 128, .Bc = 64, .stages = 2}>,   //
                         Fwd<HopperTiles{.Br = 128, .Bc = 128, .stages = 3}>,  //
                         Fwd<kLong>, Fwd<kShort>>;
  static_assert(kSmemBytes<Fwd<kShort>> <= 227 * 1024, "7d's extra O tile must fit beside the Q tile and the K/V ring");
  static_assert(kSmemBytes<Fwd<HopperTiles{.Br = 128, .Bc = 128, .stages = 3}>> <= 227 * 1024 &&
                    kSmemBytes<Fwd<kLong>> <= 227 * 1024,
                "every configuration fits the H100's 227 KB of shared memory per block");
};

}  // namespace fa::step7
