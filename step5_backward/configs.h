// FlashAttention, step by step — step 5: the named backward configurations (step5_backward/configs.h)
//
// A configuration is the dK/dV kernel's tiles plus, for the deterministic variant, the dQ kernel's, or the
// atomic kernel's tiles alone; every tile parameter is given by name (traits.h). One list per head dim
// (Configs::All) feeds everything: the kernels compiled (prepare.cuh, one dtype and head dim per
// translation unit), the names --variant accepts, step 6's tuning list and the configuration test. A
// configuration joins the course by one line in that list. Measured results: docs/history/step5.md.
#pragma once
#include <algorithm>
#include <string>
#include <type_traits>

#include "gpu/config_list.h"
#include "gpu/gpu_types.h"
#include "step5_backward/traits.h"

namespace fa::step5 {

// The deterministic variant: a dK/dV kernel and a dQ kernel, each output written by one thread.
template <class KV, class QD>
struct DeterministicConfig {
  using DkDv = KV;
  using Dq = QD;
  static constexpr bool kAtomic = false;
  static constexpr bool kHasMods = true;  // its kernels are compiled with score modifiers too (every one)
  static constexpr size_t kSmemBytes = std::max(DkDvSmem<KV>::kBytes(), DqSmem<QD>::kBytes());  // the larger
  static constexpr int kThreads = KV::kThreads;
  // "kv64x64-S2-q64x64-S2"
  static std::string name() {
    return "kv" + std::to_string(KV::Bc) + "x" + std::to_string(KV::Bq) + "-S" + std::to_string(KV::kStages) + "-q" +
           std::to_string(QD::Br) + "x" + std::to_string(QD::Bc) + "-S" + std::to_string(QD::kStages);
  }
};

// The atomic variant: one kernel that also adds dQ into fp32 with atomics; kWithMods: compiled with score
// modifiers too (the variant's defaults: the others are ablations).
template <class Tr, bool kWithMods = false>
struct AtomicConfig {
  using DkDv = Tr;
  static constexpr bool kAtomic = true;
  static constexpr bool kHasMods = kWithMods;
  static_assert(check_atomic_buffers<Tr>());
  static constexpr size_t kSmemBytes = AtomicSmem<Tr>::kBytes();
  static constexpr int kThreads = Tr::kThreads;
  static std::string name() { return Tr::name(); }
};

template <typename T, int D>
struct Configs {
  template <DkDvTiles kKV, DqTiles kQ>
  using Det = DeterministicConfig<DkDvTraits<T, D, kKV>, DqTraits<T, D, kQ>>;
  template <AtomicTiles kTiles, bool kWithMods = false>
  using Atomic = AtomicConfig<AtomicTraits<T, D, kTiles>, kWithMods>;

  // Deterministic. d = 128 takes half-height Q/dO tiles (Bq = 32) in the dK/dV kernel, so that dK and dV
  // (128 fp32 registers per thread) leave room for S^T and dP^T.
  static constexpr int kBq = D == 64 ? 64 : 32;
  using Det4 = Det<DkDvTiles{.warps = 4, .Bq = kBq, .stages = 2}, DqTiles{.warps = 4, .Bc = kBq, .stages = 2}>;
  using Det4S3 = Det<DkDvTiles{.warps = 4, .Bq = kBq, .stages = 3}, DqTiles{.warps = 4, .Bc = kBq, .stages = 3}>;
  using Det8 = Det<DkDvTiles{.warps = 8, .Bq = kBq, .stages = 2}, DqTiles{.warps = 4, .Bc = kBq, .stages = 2}>;
  // The dQ kernel with the other K/V tile width: 64 keys at d = 128, 32 at d = 64.
  using DetQ = Det<DkDvTiles{.warps = 4, .Bq = kBq, .stages = 2}, DqTiles{.warps = 4, .Bc = D == 64 ? 32 : 64, .stages = 2}>;

  // Atomic (FlashAttention 2's single kernel, atomic.cuh): 128 keys per block, 64 queries per step, 8 warps
  // in a 4 x 2 or 2 x 4 grid over (keys x queries); the 4-warp 2 x 2 grids (64 keys) fit two blocks per SM
  // where their shared memory allows, and the 32-query one fits sm_120's 99 KB.
  using Atomic4x2 = Atomic<AtomicTiles{.Bc = 128, .Bq = 64, .warps_k = 4, .warps_q = 2}>;
  using Atomic2x4 = Atomic<AtomicTiles{.Bc = 128, .Bq = 64, .warps_k = 2, .warps_q = 4}>;
  using AtomicPair = Atomic<AtomicTiles{.Bc = 64, .Bq = 64, .warps_k = 2, .warps_q = 2}>;
  using AtomicSmall = Atomic<AtomicTiles{.Bc = 64, .Bq = 32, .warps_k = 2, .warps_q = 2}, /*mods=*/true>;
  // d = 64 only: 128 queries per step on the 2 x 4 grid (FlashAttention 2's tiles): the full P^T/dS^T
  // buffers do not fit, so they are lean; alone, and with FlashAttention 2's 4 x 2 dV/dK grid and
  // XOR-stepped addresses.
  using AtomicTall = Atomic<AtomicTiles{.Bc = 128, .Bq = 128, .warps_k = 2, .warps_q = 4, .buffers = Buffers::lean}>;
  using AtomicTallKv = Atomic<AtomicTiles{.Bc = 128, .Bq = 128, .warps_k = 2, .warps_q = 4, .dkv_warps_k = 4,
                                          .xor_steps = true, .buffers = Buffers::lean}, /*mods=*/true>;
  // d = 128 only: the 2 x 4 grid's tiles with FlashAttention 2's dV/dK (4 x 2) and dQ (2 x 4) grids.
  using AtomicKvDq = Atomic<AtomicTiles{.Bc = 128, .Bq = 64, .warps_k = 2, .warps_q = 4, .dkv_warps_k = 4, .dq_warps_q = 2},
                            /*mods=*/true>;

  // The defaults (measured on the H100: docs/history/step5.md); the atomic ones are compiled with score
  // modifiers (/*mods=*/true above), as is every deterministic configuration.
  using Deterministic = std::conditional_t<D == 128, DetQ, Det4>;
  using AtomicSm90 = std::conditional_t<D == 64, AtomicTallKv, AtomicKvDq>;
  using AtomicSm120 = AtomicSmall;
  static_assert(Deterministic::kSmemBytes <= kSm120SmemBytes && AtomicSm120::kSmemBytes <= kSm120SmemBytes,
                "the defaults for sm_120 must fit in its 99 KB of shared memory per block");
  static_assert(AtomicSm90::kHasMods && AtomicSm120::kHasMods, "the atomic variant's defaults take score modifiers");

  // A packed batch of ragged sequences (packed_rows.h) runs the deterministic default's kernels.
  using Packed = ConfigList<Deterministic>;
  // Every configuration --variant can name, the tuner sweeps and the configuration test checks.
  using Shared = ConfigList<Det4, Det4S3, Det8, DetQ, Atomic4x2, Atomic2x4, AtomicPair, AtomicSmall>;
  using All = std::conditional_t<D == 64, typename Append<Shared, AtomicTall, AtomicTallKv>::type,
                                 typename Append<Shared, AtomicKvDq>::type>;
};

// Is the configuration named `name` (in the list of either head dim) an atomic one (kAtomic)? What step 6's
// exclusion reads (launch.cu), not the "-atomic" its name ends in. No for a name neither list holds.
inline bool is_atomic(const std::string& name) {
  bool atomic = false;
  const auto found = [&](auto cfg) { atomic = decltype(cfg)::type::kAtomic; };
  if (!with_config_named(name, Configs<__nv_bfloat16, 64>::All{}, found))
    with_config_named(name, Configs<__nv_bfloat16, 128>::All{}, found);
  return atomic;
}

}  // namespace fa::step5
