// FlashAttention, step by step — step 5: compile-time tile configuration of the backward kernels
// (step5_backward/traits.h)
//
// Three kernels, three tile shapes (README.md, "the two-kernel split" and "the atomic variant"), each given
// by name (DkDvTiles, DqTiles, AtomicTiles), each with its shared memory declared as a type (*Smem) from
// which the kernel's pointers and the launch's byte count both come:
//   DkDvTraits    one block owns Bc = 16 x warps keys of one KV head (each warp 16 keys: the m16 of the
//                 transposed products S^T = K Q^T and dP^T = V dO^T); Q and dO stream past in tiles of
//                 Bq query rows through step 4's TMA ring.
//   DqTraits      one block owns Br = 16 x warps query rows of one query head (each warp 16 rows, Q and dO
//                 in registers, as Q in step 4); K and V stream past in tiles of Bc keys.
//   AtomicTraits  FlashAttention 2's single kernel (the atomic variant): a block owns Bc keys as in the
//                 dK/dV kernel, but its warps tile every product in two dimensions, and P^T and dS^T pass
//                 through shared memory; it also adds dS K into an fp32 dQ.
// Every Q/K/V/dO tile is stored as D / 64 panels of [rows, 64] 16-bit elements with the 128-byte swizzle
// (TMA writes them, ldmatrix reads them), so each panel must be 1024-byte aligned: rows % 8 == 0.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/gpu_types.h"
#include "step4_fused_pipelined/kernel_traits.h"

namespace fa::step5 {

using step4::kSmemAlignSlack;

// ---- the dK/dV kernel --------------------------------------------------------------------------------
struct DkDvTiles {
  int warps = 4;   // Bc = 16 x warps keys per block
  int Bq = 64;     // query rows per Q/dO tile of the ring
  int stages = 2;  // Q/dO tiles in flight
};

template <typename T_, int D_, DkDvTiles kTiles>
struct DkDvTraits {
  using T = T_;
  static constexpr int D = D_, kWarps = kTiles.warps, Bc = 16 * kWarps, Bq = kTiles.Bq, kStages = kTiles.stages;
  static constexpr int kThreads = 32 * kWarps;

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(D == 64 || D == 128, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(Bq % 16 == 0, "dV += P^T dO and dK += dS^T Q walk the queries in k16 steps");
  static_assert(Bc <= 256 && Bq <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 Q/dO stages: the producer refills a slot one step late");
  // Per thread: dK and dV accumulators (2 x D/8 x 4 floats) + S^T and dP^T (2 x Bq/8 x 4 floats).
  static constexpr int kFragRegs = 2 * (D / 8 * 4) + 2 * (Bq / 8 * 4);
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  using KVTile = step4::PanelTile<Bc, D>;  // the K (or V) tile, loaded once (step 4's panel_tile.h)
  using QTile = step4::PanelTile<Bq, D>;   // one Q (or dO) tile of the ring
  static constexpr size_t kKVBytes = KVTile::kBytes, kQBytes = QTile::kBytes;
  static_assert(KVTile::kKeepsAlignment && QTile::kKeepsAlignment, "tiles must keep the panels 1024-byte aligned");
};

template <class Tr>
struct DkDvSmem {
  using T = typename Tr::T;
  T k[Tr::KVTile::kBytes / sizeof(T)];                 // Tr::KVTile, loaded once
  T v[Tr::KVTile::kBytes / sizeof(T)];                 // Tr::KVTile
  T q[Tr::kStages][Tr::QTile::kBytes / sizeof(T)];     // [kStages] x Tr::QTile  the Q/dO ring
  T dout[Tr::kStages][Tr::QTile::kBytes / sizeof(T)];  // [kStages] x Tr::QTile
  uint64_t kv_full;                      // K and V landed
  uint64_t full[Tr::kStages], empty[Tr::kStages];  // the ring's barriers (step 4's ring.cuh)

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(DkDvSmem); }
};

// ---- the dQ kernel -----------------------------------------------------------------------------------
struct DqTiles {
  int warps = 4;   // Br = 16 x warps query rows per block
  int Bc = 64;     // keys per K/V tile of the ring
  int stages = 2;  // K/V tiles in flight
};

template <typename T_, int D_, DqTiles kTiles>
struct DqTraits {
  using T = T_;
  static constexpr int D = D_, kWarps = kTiles.warps, Br = 16 * kWarps, Bc = kTiles.Bc, kStages = kTiles.stages;
  static constexpr int kThreads = 32 * kWarps;

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(D == 64 || D == 128, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(Bc % 16 == 0, "dQ += dS K walks the keys in k16 steps, and K is read 16 keys per ldmatrix.x4");
  static_assert(Bc <= 256 && Br <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 K/V stages: the producer refills a slot one step late");
  // Per thread: Q and dO A fragments (2 x D/16 x 4), dQ (D/8 x 4), S and dP (2 x Bc/8 x 4).
  static constexpr int kFragRegs = 2 * (D / 16 * 4) + D / 8 * 4 + 2 * (Bc / 8 * 4);
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  using QTile = step4::PanelTile<Br, D>;   // the Q (or dO) tile, loaded once (step 4's panel_tile.h)
  using KVTile = step4::PanelTile<Bc, D>;  // one K (or V) tile of the ring
  static constexpr size_t kQBytes = QTile::kBytes, kKVBytes = KVTile::kBytes;
  static_assert(KVTile::kKeepsAlignment && QTile::kKeepsAlignment, "tiles must keep the panels 1024-byte aligned");
};

template <class Tr>
struct DqSmem {
  using T = typename Tr::T;
  T q[Tr::QTile::kBytes / sizeof(T)];                // Tr::QTile, loaded once
  T dout[Tr::QTile::kBytes / sizeof(T)];             // Tr::QTile
  T k[Tr::kStages][Tr::KVTile::kBytes / sizeof(T)];  // [kStages] x Tr::KVTile  the K/V ring
  T v[Tr::kStages][Tr::KVTile::kBytes / sizeof(T)];  // [kStages] x Tr::KVTile
  uint64_t q_full;                       // Q and dO landed
  uint64_t full[Tr::kStages], empty[Tr::kStages];  // the ring's barriers

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(DqSmem); }
};

// ---- the atomic kernel -------------------------------------------------------------------------------
// How P^T and dS^T are buffered (atomic.cuh). Full: two P^T and three dS^T buffers, so that the split
// barrier ds_ready alone orders their reuse. Lean: one P^T and two dS^T buffers plus a bufs_free barrier
// that every thread arrives on when done reading them and waits on before overwriting: for tiles whose
// full buffers do not fit in 227 KB.
enum class Buffers { full, lean };

// Warp (wk, wq), wk < warps_k, wq < warps_q, computes S^T and dP^T [Bc / warps_k keys, Bq / warps_q
// queries]. dV/dK and dQ may each take a warp grid of their own (FlashAttention 2's AtomLayoutNdKV and
// AtomLayoutMdQ), since their A operands, P^T and dS^T, come from shared memory, which every warp reads:
//   dV, dK  warp (warp % dkv_warps_k, warp / dkv_warps_k): [Bc / dkv_warps_k keys, D / (warps / dkv_warps_k) columns]
//   dQ      warp (warp / (warps / dq_warps_q), ...):       [Bq / dq_warps_q queries, D / (warps / dq_warps_q) columns]
// 0 means "as S^T's grid" (dV/dK: keys wk, columns wq; dQ: queries wq, columns wk). xor_steps picks how
// the kernel forms its ldmatrix addresses (device.cuh, Operand).
struct AtomicTiles {
  int Bc = 128, Bq = 64;
  int warps_k = 4, warps_q = 2;
  int stages = 2;
  int dkv_warps_k = 0;
  int dq_warps_q = 0;
  bool xor_steps = false;
  Buffers buffers = Buffers::full;
};

template <typename T_, int D_, AtomicTiles kTiles>
struct AtomicTraits {
  using T = T_;
  static constexpr int D = D_, Bc = kTiles.Bc, Bq = kTiles.Bq, kWarpsK = kTiles.warps_k, kWarpsQ = kTiles.warps_q;
  static constexpr int kStages = kTiles.stages;
  static constexpr int kWarps = kWarpsK * kWarpsQ, kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = Bc / kWarpsK, kWarpQueries = Bq / kWarpsQ;
  static constexpr int kDkvWarpsK = kTiles.dkv_warps_k ? kTiles.dkv_warps_k : kWarpsK, kDkvWarpsD = kWarps / kDkvWarpsK;
  static constexpr int kWarpKeysDkv = Bc / kDkvWarpsK, kWarpDkv = D / kDkvWarpsD;
  static constexpr int kDqWarpsQ = kTiles.dq_warps_q ? kTiles.dq_warps_q : kWarpsQ, kDqWarpsD = kWarps / kDqWarpsQ;
  static constexpr int kWarpQueriesDq = Bq / kDqWarpsQ, kWarpDq = D / kDqWarpsD;
  static constexpr bool kXorSteps = kTiles.xor_steps;
  static constexpr bool kLean = kTiles.buffers == Buffers::lean;

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(D == 64 || D == 128, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(Bc % kWarpsK == 0 && Bq % kWarpsQ == 0, "the warps split the keys and the queries evenly");
  static_assert(kWarps % kDkvWarpsK == 0 && Bc % kDkvWarpsK == 0, "the dV/dK grid splits the warps and the keys evenly");
  static_assert(kWarpKeys % 16 == 0 && kWarpKeysDkv % 16 == 0, "a warp's keys are whole m16 tiles (rows of S^T, dV and dK)");
  static_assert(kWarps % kDqWarpsQ == 0 && Bq % kDqWarpsQ == 0, "the dQ grid splits the warps and the queries evenly");
  static_assert(kWarpQueries % 16 == 0 && kWarpQueriesDq % 16 == 0,
                "a warp's queries are pairs of n8 tiles of S^T (one ldmatrix.x4) and whole m16 tiles of dQ");
  static_assert(kWarpDkv % 16 == 0 && kWarpDq % 16 == 0, "head-dim columns are read 16 at a time (ldmatrix.x4.trans)");
  static_assert(!kXorSteps || ((kWarpDkv & (kWarpDkv - 1)) == 0 && (kWarpDq & (kWarpDq - 1)) == 0),
                "XOR steps need a warp's head-dim columns to start at a multiple of a power of two larger than its "
                "steps, so that the steps' chunk bits are disjoint from the start's (device.cuh, Operand)");
  static_assert(Bc <= 256 && Bq <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 Q/dO stages: the producer refills a slot one step late");
  static_assert(2 * Bq <= kWarps * 32, "one thread fetches each LSE and D value of a query tile");
  // Per thread: dK and dV (2 x kWarpKeysDkv x kWarpDkv / 32) + S^T and dP^T (2 x kWarpKeys x kWarpQueries / 32).
  static constexpr int kFragRegs = 2 * kWarpKeysDkv * kWarpDkv / 32 + 2 * kWarpKeys * kWarpQueries / 32;
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  using KVTile = step4::PanelTile<Bc, D>;  // the K (or V) tile, loaded once (step 4's panel_tile.h)
  using QTile = step4::PanelTile<Bq, D>;   // one Q (or dO) tile of the ring
  static constexpr size_t kKVBytes = KVTile::kBytes, kQBytes = QTile::kBytes;
  static_assert(KVTile::kKeepsAlignment && QTile::kKeepsAlignment, "tiles must keep the panels 1024-byte aligned");
  // P^T and dS^T: [Bc keys, Bq queries] 16-bit tiles. Rows are padded by 8 elements (16 bytes): the 8 rows
  // an stmatrix writes or an ldmatrix (.trans or not) reads then fall in 8 different 16-byte bank groups.
  static constexpr int kPitch = Bq + 8;
  static constexpr int kPBufs = kLean ? 1 : 2, kDsBufs = kLean ? 2 : 3;
  static_assert((size_t(Bc) * kPitch * sizeof(T)) % 16 == 0, "ldmatrix rows and the barriers after the buffers stay aligned");

  // "kv128x64-w2x4-dkv4x2-dq2x4-S2-atomic": what --variant and the tests call this configuration.
  static std::string name() {
    std::string n = "kv" + std::to_string(Bc) + "x" + std::to_string(Bq) + "-w" + std::to_string(kWarpsK) + "x" +
                    std::to_string(kWarpsQ);
    if (kDkvWarpsK != kWarpsK) n += "-dkv" + std::to_string(kDkvWarpsK) + "x" + std::to_string(kDkvWarpsD);
    if (kDqWarpsQ != kWarpsQ) n += "-dq" + std::to_string(kDqWarpsQ) + "x" + std::to_string(kDqWarpsD);
    return n + "-S" + std::to_string(kStages) + (kXorSteps ? "-xor" : "") + "-atomic";
  }
};

// The lean buffers' extra barrier; nothing with the full ones.
template <bool kLean>
struct LeanBarrier {};
template <>
struct LeanBarrier<true> {
  uint64_t bufs_free;  // every thread is done reading P^T of step it and dS^T of it - 1
};

template <class Tr>
struct AtomicSmem {
  using T = typename Tr::T;
  T k[Tr::KVTile::kBytes / sizeof(T)];                 // Tr::KVTile, loaded once
  T v[Tr::KVTile::kBytes / sizeof(T)];                 // Tr::KVTile
  T q[Tr::kStages][Tr::QTile::kBytes / sizeof(T)];     // [kStages] x Tr::QTile  the Q/dO ring
  T dout[Tr::kStages][Tr::QTile::kBytes / sizeof(T)];  // [kStages] x Tr::QTile
  T p[Tr::kPBufs][Tr::Bc * Tr::kPitch];         // [kPBufs][Bc, kPitch]   Pd^T
  T ds[Tr::kDsBufs][Tr::Bc * Tr::kPitch];       // [kDsBufs][Bc, kPitch]  dS^T
  float lse_d[2][2][Tr::Bq];                    // [slot it % 2][LSE (log2 units), D][Bq]
  uint64_t kv_full;                             // K and V landed
  uint64_t full[Tr::kStages], empty[Tr::kStages];  // the ring's barriers
  uint64_t ds_ready[Tr::kDsBufs];               // every thread has stored its P^T and dS^T values
  [[no_unique_address]] LeanBarrier<Tr::kLean> lean;

  static constexpr size_t kBytes() { return kSmemAlignSlack + sizeof(AtomicSmem); }
  // What the full buffers would take (the barriers count the same: ds_ready[3], or ds_ready[2] + bufs_free).
  static constexpr size_t kFullBytes() { return kBytes() + (5 - Tr::kPBufs - Tr::kDsBufs) * sizeof(p[0]); }
};

// The buffer choice is named in each configuration (configs.h) and checked here: full buffers only where
// they fit, lean ones only where the full ones would not (lean costs a barrier wait per step).
template <class Tr>
constexpr bool check_atomic_buffers() {
  using Smem = AtomicSmem<Tr>;
  static_assert(Tr::kLean || Smem::kBytes() <= kSm90SmemBytes,
                "the full P^T/dS^T buffers do not fit in sm_90's 227 KB with these tiles: name Buffers::lean");
  static_assert(!Tr::kLean || Smem::kBytes() <= kSm90SmemBytes, "even the lean P^T/dS^T buffers must fit in 227 KB");
  static_assert(!Tr::kLean || Smem::kFullBytes() > kSm90SmemBytes,
                "these tiles fit the full P^T/dS^T buffers: lean ones would only add a barrier wait per step");
  return true;
}

}  // namespace fa::step5
