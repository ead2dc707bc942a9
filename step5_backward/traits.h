// FlashAttention, step by step — step 5: compile-time tile configuration of the backward kernels
// (step5_backward/traits.h)
//
// Three kernels, three tile shapes (README.md, "the two-kernel split" and "the atomic variant"):
//   DkDvTraits    one block owns Bc = 16 x Warps keys of one KV head (each warp 16 keys: the m16 of the
//                 transposed products S^T = K Q^T and dP^T = V dO^T); Q and dO stream past in tiles of
//                 Bq query rows through a ring of Stages shared-memory slots.
//   DqTraits      one block owns Br = 16 x Warps query rows of one query head (each warp 16 rows, Q and dO
//                 in registers, as Q in step 4); K and V stream past in tiles of Bc keys.
//   AtomicTraits  FlashAttention 2's single kernel (the atomic variant): a block owns Bc keys as in the
//                 dK/dV kernel, but its WarpsK x WarpsQ warps tile every product in two dimensions, and
//                 P^T and dS^T pass through shared memory; it also adds dS K into an fp32 dQ.
// Every Q/K/V/dO tile is stored as D / 64 panels of [rows, 64] 16-bit elements with the 128-byte swizzle
// (TMA writes them, ldmatrix reads them), so each panel must be 1024-byte aligned: rows % 8 == 0.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fa::step5 {

// Shared memory one block may use on sm_120 (RTX 50-series): 99 KB with the opt-in attribute.
constexpr size_t kSm120SmemBytes = 99 * 1024;
// And on sm_90 (H100), the most the atomic kernel's largest tiles may take.
constexpr size_t kSm90SmemBytes = 227 * 1024;

template <typename T_, int D_, int Warps_, int Bq_, int Stages_>
struct DkDvTraits {
  using T = T_;
  static constexpr int D = D_, kWarps = Warps_, Bc = 16 * Warps_, Bq = Bq_, kStages = Stages_;
  static constexpr bool kAtomicDq = false;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPanels = D / 64;

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(D == 64 || D == 128, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(Bq % 16 == 0, "dV += P^T dO and dK += dS^T Q walk the queries in k16 steps");
  static_assert(Bc <= 256 && Bq <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 Q/dO stages: the producer refills a slot one step late");
  // Per thread: dK and dV accumulators (2 x D/8 x 4 floats) + S^T and dP^T (2 x Bq/8 x 4 floats).
  static constexpr int kFragRegs = 2 * (D / 8 * 4) + 2 * (Bq / 8 * 4);
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  static constexpr size_t kKVBytes = size_t(Bc) * D * sizeof(T);  // the K (or V) tile, loaded once
  static constexpr size_t kQBytes = size_t(Bq) * D * sizeof(T);   // one Q (or dO) tile of the ring
  static constexpr size_t kBarrierBytes = 8 * (1 + 2 * kStages);  // kv_full, full[stages], empty[stages]

  // 1024 bytes of slack align the dynamic shared base (16-byte aligned) to the panels' 1024 bytes.
  static constexpr size_t kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + kBarrierBytes;
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles must keep the panels 1024-byte aligned");
  static constexpr bool kFitsSm120 = kSmemBytes <= kSm120SmemBytes;
};

template <typename T_, int D_, int Warps_, int Bc_, int Stages_>
struct DqTraits {
  using T = T_;
  static constexpr int D = D_, kWarps = Warps_, Br = 16 * Warps_, Bc = Bc_, kStages = Stages_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPanels = D / 64;

  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(D == 64 || D == 128, "d is split into 64-column panels, the width of the 128-byte swizzle");
  static_assert(Bc % 16 == 0, "dQ += dS K walks the keys in k16 steps, and K is read 16 keys per ldmatrix.x4");
  static_assert(Bc <= 256 && Br <= 256, "a TMA box spans at most 256 rows");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 K/V stages: the producer refills a slot one step late");
  // Per thread: Q and dO A fragments (2 x D/16 x 4), dQ (D/8 x 4), S and dP (2 x Bc/8 x 4).
  static constexpr int kFragRegs = 2 * (D / 16 * 4) + D / 8 * 4 + 2 * (Bc / 8 * 4);
  static_assert(kFragRegs <= 200, "fragments alone would exceed the 255-register limit once addresses are added");

  static constexpr size_t kQBytes = size_t(Br) * D * sizeof(T);   // the Q (or dO) tile, loaded once
  static constexpr size_t kKVBytes = size_t(Bc) * D * sizeof(T);  // one K (or V) tile of the ring
  static constexpr size_t kBarrierBytes = 8 * (1 + 2 * kStages);  // q_full, full[stages], empty[stages]
  static constexpr size_t kSmemBytes = 1024 + 2 * kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles must keep the panels 1024-byte aligned");
  static constexpr bool kFitsSm120 = kSmemBytes <= kSm120SmemBytes;
};

// The atomic variant's kernel (atomic.cuh). Warp (wk, wq), wk < WarpsK, wq < WarpsQ, computes
//   S^T, dP^T  [kWarpKeys = Bc / WarpsK keys,        kWarpQueries = Bq / WarpsQ queries]
// and, each on a grid of its own, warp (warp % DkvWarpsK, warp / DkvWarpsK) and warp
// (warp / kDqWarpsD, warp % kDqWarpsD) compute
//   dV, dK     [kWarpKeysDkv = Bc / DkvWarpsK keys,  kWarpDkv = D / (kWarps / DkvWarpsK) columns]
//   dQ         [kWarpQueriesDq = Bq / DqWarpsQ,      kWarpDq = D / (kWarps / DqWarpsQ) columns]
// so each operand tile is read by a few warps, not by all of them as in the dK/dV kernel. By default both
// follow S^T's grid (dV/dK: keys wk, columns wq; dQ: queries wq, columns wk). They may differ because
// their A operands, P^T and dS^T, come from shared memory, which every warp can read (FlashAttention 2's
// AtomLayoutNdKV and AtomLayoutMdQ).
// XorSteps: how the kernel forms its ldmatrix addresses (device.cuh, Operand).
template <typename T_, int D_, int Bc_, int Bq_, int WarpsK_, int WarpsQ_, int Stages_, int DkvWarpsK_ = WarpsK_,
          bool XorSteps_ = false, int DqWarpsQ_ = WarpsQ_>
struct AtomicTraits {
  using T = T_;
  static constexpr int D = D_, Bc = Bc_, Bq = Bq_, kWarpsK = WarpsK_, kWarpsQ = WarpsQ_, kStages = Stages_;
  static constexpr bool kAtomicDq = true;
  static constexpr int kWarps = kWarpsK * kWarpsQ, kThreads = 32 * kWarps;
  static constexpr int kPanels = D / 64;
  static constexpr int kWarpKeys = Bc / kWarpsK, kWarpQueries = Bq / kWarpsQ;
  static constexpr int kDkvWarpsK = DkvWarpsK_, kDkvWarpsD = kWarps / kDkvWarpsK;
  static constexpr int kWarpKeysDkv = Bc / kDkvWarpsK, kWarpDkv = D / kDkvWarpsD;
  static constexpr int kDqWarpsQ = DqWarpsQ_, kDqWarpsD = kWarps / kDqWarpsQ;
  static constexpr int kWarpQueriesDq = Bq / kDqWarpsQ, kWarpDq = D / kDqWarpsD;
  static constexpr bool kXorSteps = XorSteps_;

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

  static constexpr size_t kKVBytes = size_t(Bc) * D * sizeof(T);  // the K (or V) tile, loaded once
  static constexpr size_t kQBytes = size_t(Bq) * D * sizeof(T);   // one Q (or dO) tile of the ring
  // P^T and dS^T: [Bc keys, Bq queries] 16-bit tiles. Rows are padded by 8 elements (16 bytes): the 8 rows
  // an stmatrix writes or an ldmatrix (.trans or not) reads then fall in 8 different 16-byte bank groups.
  // Two P^T and three dS^T buffers let the split barrier alone order their reuse (atomic.cuh); where they
  // do not fit in sm_90's 227 KB (Bq = 128), the kernel is `lean`: one P^T and two dS^T buffers, plus a
  // bufs_free barrier: every thread arrives on it when done reading them and waits on it before overwriting.
  static constexpr int kPitch = Bq + 8;
  static constexpr size_t kPBytes = size_t(Bc) * kPitch * sizeof(T);
  static constexpr size_t kLseDBytes = 2 * 2 * Bq * sizeof(float);  // two slots of LSE and D, Bq rows each
  // alignment, K, V, the ring, LSE and D
  static constexpr size_t kTileBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + kLseDBytes;
  static constexpr size_t kRingBarrierBytes = 8 * (1 + 2 * kStages);  // kv_full, full[stages], empty[stages]
  static constexpr int kFullPBufs = 2, kFullDsBufs = 3;  // without the lean barrier: ds_ready[3]
  static constexpr bool kLean =
      kTileBytes + (kFullPBufs + kFullDsBufs) * kPBytes + kRingBarrierBytes + 8 * kFullDsBufs > kSm90SmemBytes;
  static constexpr int kPBufs = kLean ? 1 : kFullPBufs, kDsBufs = kLean ? 2 : kFullDsBufs;
  // and ds_ready[kDsBufs], bufs_free (lean only)
  static constexpr size_t kBarrierBytes = kRingBarrierBytes + 8 * (kDsBufs + (kLean ? 1 : 0));
  static constexpr size_t kSmemBytes =
      kTileBytes + (kPBufs + kDsBufs) * kPBytes + kBarrierBytes;
  static_assert(kSmemBytes <= kSm90SmemBytes, "even the lean buffers must fit in sm_90's 227 KB per block");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tiles must keep the panels 1024-byte aligned");
  static_assert(kPBytes % 16 == 0, "ldmatrix rows and the barriers after the buffers stay aligned");
  static constexpr bool kFitsSm120 = kSmemBytes <= kSm120SmemBytes;
};

}  // namespace fa::step5
