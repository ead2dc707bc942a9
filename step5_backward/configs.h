// FlashAttention, step by step — step 5: the named backward configurations (step5_backward/configs.h)
//
// A configuration is the dK/dV kernel's tiles plus, for the deterministic variant, the dQ kernel's. The
// defaults per variant and the list --variant (and step 6's tuner) can pick from live here; launch.cu
// maps names to them, and instances_*.cu compile their kernels, one dtype and head dim per translation
// unit so that a build spreads them over its cores.
#pragma once
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "traits.h"

namespace fa::step5 {

// One backward configuration: the dK/dV kernel's tiles and, for the deterministic variant, the dQ
// kernel's (void for the atomic variant, whose dK/dV kernel also produces dQ).
template <class KV, class QD = void>
struct BwdConfig {
  using DkDv = KV;
  using Dq = QD;
  static constexpr bool kAtomic = KV::kAtomicDq;
  static_assert(kAtomic == std::is_void_v<QD>, "the atomic variant has no dQ kernel; the deterministic one needs one");
  static constexpr size_t smem_bytes() {
    if constexpr (kAtomic) return KV::kSmemBytes;
    else return std::max(KV::kSmemBytes, QD::kSmemBytes);
  }
  static constexpr size_t kSmemBytes = smem_bytes();  // the larger of its kernels'
};

template <class... Cfg>
struct ConfigList {};

template <class List, class... More>
struct Append;
template <class... Cfg, class... More>
struct Append<ConfigList<Cfg...>, More...> {
  using type = ConfigList<Cfg..., More...>;
};

template <typename T, int D>
struct Configs {
  // Deterministic. d = 128 takes half-height Q/dO tiles (Bq = 32) in the dK/dV kernel and half-width K/V
  // tiles in the dQ kernel, so that dK and dV (128 fp32 registers per thread) or Q, dO and dQ leave room
  // for S and dP. Measured on the H100 (docs/results/step5.md): two blocks of 4 warps per SM beat one of
  // 8 (their barriers and phases desynchronise), and a third pipeline stage buys nothing.
  static constexpr int kBq = D == 64 ? 64 : 32;
  //                          T  D  Warps Bq   Stages         T  D  Warps Bc   Stages
  using Det4 = BwdConfig<DkDvTraits<T, D, 4, kBq, 2>, DqTraits<T, D, 4, kBq, 2>>;
  using Det4S3 = BwdConfig<DkDvTraits<T, D, 4, kBq, 3>, DqTraits<T, D, 4, kBq, 3>>;
  using Det8 = BwdConfig<DkDvTraits<T, D, 8, kBq, 2>, DqTraits<T, D, 4, kBq, 2>>;
  // The dQ kernel with the other K/V tile width: 64 keys at d = 128 (255 registers), 32 at d = 64.
  using DetQ = BwdConfig<DkDvTraits<T, D, 4, kBq, 2>, DqTraits<T, D, 4, D == 64 ? 32 : 64, 2>>;
  // Atomic (FlashAttention 2's single kernel, atomic.cuh): 128 keys per block (Bc = 128 halves the dQ
  // atomics of Bc = 64), 64 queries per step, 8 warps in a 4 x 2 or 2 x 4 grid over (keys x queries):
  // warp tiles of 32 x 32 or 64 x 16 (S^T, dP^T). 219 KB of shared memory at d = 128: sm_90 only.
  // The 4-warp 2 x 2 grids (64 keys) fit two blocks per SM where their shared memory allows it (d = 64 with
  // 64 queries per step, both head dims with 32), and the 32-query one fits sm_120's 99 KB.
  //                             T  D  Bc   Bq  WarpsK WarpsQ Stages [DkvWarpsK XorSteps]
  using Atomic = BwdConfig<AtomicTraits<T, D, 128, 64, 4, 2, 2>>;
  using Atomic2x4 = BwdConfig<AtomicTraits<T, D, 128, 64, 2, 4, 2>>;
  using AtomicPair = BwdConfig<AtomicTraits<T, D, 64, 64, 2, 2, 2>>;
  using AtomicSmall = BwdConfig<AtomicTraits<T, D, 64, 32, 2, 2, 2>>;
  // d = 64 only: 128 queries per step on the 2 x 4 grid (warp tiles 64 x 32), as FlashAttention 2 does:
  // fewer ldmatrix per mma (step5.md #16). Five P^T/dS^T buffers would not fit in 227 KB, so the kernel
  // runs lean (traits.h). At d = 128 dV and dK alone would take 128 registers per thread, beside S^T's
  // and dP^T's 128.
  using AtomicTall = BwdConfig<AtomicTraits<T, D, 128, 128, 2, 4, 2>>;
  // The same, with FlashAttention 2's dV/dK grid (4 x 2 warps, tiles 32 keys x 32 columns: 8 ldmatrix per
  // k16 step instead of 10) and XOR-stepped addresses (device.cuh, Operand): +3.5 to +4.6 % at N >= 4096
  // (step5.md #19-20). At d = 128 XOR steps cost 1 %, and the 4 x 2 dV/dK grid alone reads as many bytes.
  using AtomicTallKv = BwdConfig<AtomicTraits<T, D, 128, 128, 2, 4, 2, 4, true>>;
  // d = 128 only: the 2 x 4 grid's Bq = 64 tiles with FlashAttention 2's dV/dK and dQ grids, 4 x 2 over
  // (keys x columns) and 2 x 4 over (queries x columns): dV/dK tiles 32 x 64 (12 ldmatrix per k16 step, as
  // 64 x 32), dQ tiles 32 x 32 (4 per k16 step instead of the 16 x 64 tiles' 5): +1.8 to +2.1 % at
  // N >= 4096 over Atomic2x4, the dQ grid alone +1.1 % (step5.md #21).
  //                             T  D  Bc   Bq  WarpsK WarpsQ Stages DkvWarpsK XorSteps DqWarpsQ
  using AtomicKvDq = BwdConfig<AtomicTraits<T, D, 128, 64, 2, 4, 2, 4, false, 2>>;

  // d = 128: the 64-key dQ tiles won at every point of the step 6 sweep (+1.5 to +4%, step5.md).
  using Deterministic = std::conditional_t<D == 128, DetQ, Det4>;
  using AtomicSm90 = std::conditional_t<D == 64, AtomicTallKv, AtomicKvDq>;
  using AtomicSm120 = AtomicSmall;
  static_assert(Deterministic::kSmemBytes <= kSm120SmemBytes && AtomicSm120::kSmemBytes <= kSm120SmemBytes,
                "the defaults for sm_120 must fit in its 99 KB of shared memory per block");
  // Every configuration --variant can name (step 6 sweeps them).
  using Shared = ConfigList<Det4, Det4S3, Det8, DetQ, Atomic, Atomic2x4, AtomicPair, AtomicSmall>;
  using All = std::conditional_t<D == 64, typename Append<Shared, AtomicTall, AtomicTallKv>::type,
                                 typename Append<Shared, AtomicKvDq>::type>;
};

// X(T, D, Name) for each configuration of Configs<T, D>::Shared, in the same order, and X(T, 64, Name) and
// X(T, 128, Name) for those one head dim adds: the instances_*.cu files compile their kernels with them (a
// name missing here fails at link time, not silently).
#define FA_STEP5_FOR_EACH_CONFIG(X, T, D) \
  X(T, D, Det4) X(T, D, Det4S3) X(T, D, Det8) X(T, D, DetQ) X(T, D, Atomic) X(T, D, Atomic2x4) X(T, D, AtomicPair) \
      X(T, D, AtomicSmall)
#define FA_STEP5_FOR_EACH_D64_CONFIG(X, T) X(T, 64, AtomicTall) X(T, 64, AtomicTallKv)
#define FA_STEP5_FOR_EACH_D128_CONFIG(X, T) X(T, 128, AtomicKvDq)

template <class Cfg>
std::string config_name() {
  using KV = typename Cfg::DkDv;
  const std::string kv = "kv" + std::to_string(KV::Bc) + "x" + std::to_string(KV::Bq);
  if constexpr (Cfg::kAtomic) {
    std::string grid = "-w" + std::to_string(KV::kWarpsK) + "x" + std::to_string(KV::kWarpsQ);
    if (KV::kDkvWarpsK != KV::kWarpsK) grid += "-dkv" + std::to_string(KV::kDkvWarpsK) + "x" + std::to_string(KV::kDkvWarpsD);
    if (KV::kDqWarpsQ != KV::kWarpsQ) grid += "-dq" + std::to_string(KV::kDqWarpsQ) + "x" + std::to_string(KV::kDqWarpsD);
    return kv + grid + "-S" + std::to_string(KV::kStages) + (KV::kXorSteps ? "-xor" : "") + "-atomic";
  } else {
    using DQ = typename Cfg::Dq;
    return kv + "-S" + std::to_string(KV::kStages) + "-q" + std::to_string(DQ::Br) + "x" + std::to_string(DQ::Bc) +
           "-S" + std::to_string(DQ::kStages);
  }
}

template <class... Cfg>
std::vector<std::string> config_names(ConfigList<Cfg...>) {
  return {config_name<Cfg>()...};
}

}  // namespace fa::step5
