// FlashAttention, step by step — step 4: the named forward configurations (step4_fused_pipelined/configs.h)
//
// One list per head dim: the defaults per architecture and every configuration --variant (and step 6's
// tuner) can pick. launch.cu compiles a kernel for each entry of `All` and looks them up by name, so a
// configuration joins the course by one line in that list. Measured results: docs/history/step4.md.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpu/config_list.h"
#include "gpu/gpu_types.h"
#include "step4_fused_pipelined/kernel_traits.h"
#include "step4_fused_pipelined/splits.h"  // how many splits 4f runs a decode with

namespace fa::step4 {

// The chapter's sub-steps at the tiles of `tiles`: 4a and 4b copy with the threads (padded rows, then the
// swizzle), 4c with cp.async into two buffers, 4d is `tiles` itself (TMA, the default kernel).
enum class Substep { k4a, k4b, k4c, k4d };
constexpr FwdTiles substep(FwdTiles tiles, Substep s) {
  if (s == Substep::k4a) return {tiles.Br, tiles.Bc, 1, SmemLayout::kPadded, TileCopy::kThreads};
  if (s == Substep::k4b) return {tiles.Br, tiles.Bc, 1, SmemLayout::kSwizzle, TileCopy::kThreads};
  if (s == Substep::k4c) return {tiles.Br, tiles.Bc, 2, SmemLayout::kSwizzle, TileCopy::kCpAsync};
  return tiles;
}

template <typename T, int D>
struct Configs {
  template <FwdTiles kTiles>
  using Fwd = FwdTraits<T, D, kTiles>;
  // The H100 (sm_90, 227 KB per block): d = 128 takes long K/V tiles and 8 warps, d = 64 two blocks of
  // 4 warps per SM.
  static constexpr FwdTiles kSm90{.Br = D == 64 ? 64 : 128, .Bc = D == 64 ? 64 : 128, .stages = 2};
  using Sm90 = Fwd<kSm90>;
  // The RTX 50-series (sm_120, 99 KB per block): the best of the configurations that fit.
  static constexpr FwdTiles kSm120{.Br = 64, .Bc = 64, .stages = 2};
  using Sm120 = Fwd<kSm120>;
  static_assert(kFwdSmemBytes<Sm120> <= kSm120SmemBytes,
                "the sm_120 default must fit in sm_120's 99 KB of shared memory per block");
  // Decoding (a head's queries fill less than a tile, or --splits): 4f, split-KV, on either architecture.
  // At d = 64 a tile of 128 keys (16 KB of K, 16 KB of V per barrier wait), at d = 128 one of 64 (the same
  // bytes; 128 keys would not fit sm_120). The other key-tile length is a configuration too (step 6 tries it).
  static constexpr FwdTiles kDecode{.Br = 64, .Bc = D == 64 ? 128 : 64, .stages = 2, .split_kv = true};
  static constexpr FwdTiles kDecodeOther{.Br = 64, .Bc = D == 64 ? 64 : 128, .stages = 2, .split_kv = true};
  using Decode = Fwd<kDecode>;
  static_assert(kFwdSmemBytes<Decode> <= kSm120SmemBytes, "the decoding kernel must fit sm_120's 99 KB too");
  static constexpr FwdTiles k64{.Br = 64, .Bc = 64}, k128{.Br = 128, .Bc = 128};
  // sm_80-89 (A100, RTX 30/40, L4, A10: cp.async but no TMA): 4c's kernel at the 64 x 64 tiles, which every
  // part of the family holds (99 KB per block on sm_86/89; sm_80's 163 KB would hold more, not chosen yet).
  static constexpr FwdTiles kSm80 = substep(k64, Substep::k4c);
  using Sm80 = Fwd<kSm80>;
  static_assert(kFwdSmemBytes<Sm80> <= kSm120SmemBytes, "the sm_8x default must fit sm_86/89's 99 KB per block");
  static_assert((kSm90.Br == k64.Br || kSm90.Br == k128.Br) && kSm120.Br == k64.Br,
                "the sub-steps are compiled at 64 x 64 and 128 x 128 tiles: the defaults' tiles");
  // A packed batch of ragged sequences (4g, packed_batch.h) runs 4f's kernel at the defaults' tiles.
  using Packed = ConfigList<Sm90, Sm120>;
  // Every configuration --variant can name: tile sizes, warps, pipeline depth, the swizzle ablation, and
  // the sub-steps.
  using All = ConfigList<Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 1}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 2}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 64, .stages = 3}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 128, .stages = 2}>, //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 2}>,   //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 3}>,   //
                         Fwd<FwdTiles{.Br = 64, .Bc = 128, .stages = 2}>,  //
                         Fwd<FwdTiles{.Br = 64, .Bc = 64, .stages = 2, .layout = SmemLayout::kPlain}>,  //
                         Fwd<FwdTiles{.Br = 128, .Bc = 128, .stages = 2, .head_fast = true}>,          //
                         Decode, Fwd<kDecodeOther>,                                                    //
                         Fwd<substep(k64, Substep::k4a)>, Fwd<substep(k64, Substep::k4b)>,             //
                         Fwd<substep(k64, Substep::k4c)>,                                              //
                         Fwd<substep(k128, Substep::k4a)>, Fwd<substep(k128, Substep::k4b)>,           //
                         Fwd<substep(k128, Substep::k4c)>>;
};

// The tiles of the configuration named `name`, or none (gpu/config_list.h): what launch.cu decides for the
// harness (which configurations step 6 leaves out, which take --splits) reads these fields, not the letters
// tiles_name made of them.
inline std::optional<FwdTiles> tiles_named(const std::string& name) { return config_tiles_named<Configs>(name); }

// Does the configuration named `name` run 4f, split-KV decoding? (No for a name neither list holds.)
inline bool is_split_kv(const std::string& name) {
  const std::optional<FwdTiles> tiles = tiles_named(name);
  return tiles && tiles->split_kv;
}

}  // namespace fa::step4
