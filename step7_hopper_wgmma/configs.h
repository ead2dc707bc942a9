// FlashAttention, step by step — step 7: the named configurations (step7_hopper_wgmma/configs.h)
//
// One list per head dim, as in step 4 (step4_fused_pipelined/configs.h): the chapter's sub-steps 7a-7c at the
// default tiles, and the other tiles --variant can name. launch.cu compiles a kernel for each entry of `All`.
// Measured results: docs/results/step7.md.
#pragma once
#include "gpu/config_list.h"
#include "step7_hopper_wgmma/kernel_traits.h"

namespace fa::step7 {

// The chapter's sub-step `d` at the tiles of `tiles`.
constexpr HopperTiles substep(HopperTiles tiles, Design d) { return {tiles.Br, tiles.Bc, tiles.stages, d}; }

template <typename T, int D>
struct Configs {
  template <HopperTiles kTiles>
  using Fwd = HopperTraits<T, D, kTiles>;
  // The default: 7c (ping-pong) with 128 x 128 tiles and two K/V stages, at both head dims.
  static constexpr HopperTiles kDefault{.Br = 128, .Bc = 128, .stages = 2, .design = Design::kPingPong};
  using Default = Fwd<kDefault>;
  // Every configuration --variant can name: the chapter's sub-steps at the default's tiles, other tiles.
  using All = ConfigList<Fwd<substep(kDefault, Design::kWgmma)>, Fwd<substep(kDefault, Design::kSpecialized)>, Default,
                         Fwd<HopperTiles{.Br = 128, .Bc = 64, .stages = 2}>,   //
                         Fwd<HopperTiles{.Br = 128, .Bc = 128, .stages = 3}>,  //
                         Fwd<HopperTiles{.Br = 128, .Bc = 176, .stages = 2}>,  //
                         Fwd<substep(kDefault, Design::kPersistent)>>;
  static_assert(kSmemBytes<Fwd<substep(kDefault, Design::kPersistent)>> <= 227 * 1024,
                "7d's extra O tile must fit beside the default's Q tile and K/V ring");
  static_assert(kSmemBytes<Fwd<HopperTiles{.Br = 128, .Bc = 128, .stages = 3}>> <= 227 * 1024,
                "every configuration fits the H100's 227 KB of shared memory per block");
};

}  // namespace fa::step7
