// FlashAttention, step by step — step 4: the named forward configurations (step4_fused_pipelined/configs.h)
//
// One list per head dim: the defaults per architecture and every configuration --variant (and step 6's
// tuner) can pick. launch.cu compiles a kernel for each entry of `All` and looks them up by name, so a
// configuration joins the course by one line in that list. Measured results: docs/results/step4.md.
#pragma once
#include "gpu/config_list.h"
#include "gpu/gpu_types.h"
#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step4 {

template <typename T, int D>
struct Configs {
  template <FwdTiles kTiles>
  using Fwd = FwdTraits<T, D, kTiles>;
  // The H100 (sm_90, 227 KB per block): d = 128 takes long K/V tiles and 8 warps, d = 64 two blocks of
  // 4 warps per SM.
  using Sm90 = Fwd<FwdTiles{.Br = D == 64 ? 64 : 128, .Bc = D == 64 ? 64 : 128, .stages = 2}>;
  // The RTX 50-series (sm_120, 99 KB per block): the best of the configurations that fit.
  using Sm120 = Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 2}>;
  static_assert(kFwdSmemBytes<Sm120> <= kSm120SmemBytes,
                "the sm_120 default must fit in sm_120's 99 KB of shared memory per block");
  // Every configuration --variant can name: tile sizes, warps, pipeline depth, and the swizzle ablation.
  using All = ConfigList<Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 1}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 2}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 3}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 128, .stages = 2}>, //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 2}>,   //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 3}>,   //
                         Fwd<FwdTiles{.Br = 64, .Bc = 128, .stages = 2}>,  //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 2, .swizzle = false}>>;
};

}  // namespace fa::step4
