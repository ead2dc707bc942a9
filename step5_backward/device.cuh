// FlashAttention, step by step — step 5: what the backward kernels share (step5_backward/device.cuh)
//
// Step 4's building blocks (ring.cuh, fragments.cuh, scheduler.cuh, mask.h, dropout.cuh) carry the data
// movement; this file adds what only the backward needs: the parameter block, the XOR-stepped operand
// addressing (a per-configuration choice of the atomic kernel), the store of a warp's accumulator rows,
// the schedule of a block that owns a tile of keys with the loads of its Q/dO ring (the dK/dV and atomic
// kernels), and the element-wise step every kernel runs on its tile (P and dS through the kernel's mask
// type, step 4's mask.h: CausalMask, or 4e's ScoreMods with the softcap's derivative). With score modifiers,
// ModColumns gives each query's step4::ModRow from its tile's first one, and DBiasRows is where dS_pre
// (dBias) goes.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "core/tile_range.h"
#include "gpu/attn_params.h"
#include "gpu/ptx.h"
#include "step4_fused_pipelined/fragments.cuh"
#include "step4_fused_pipelined/mask.h"
#include "step4_fused_pipelined/score_mod.cuh"
#include "step5_backward/packed_rows.h"

namespace fa::step5 {

// Step 4's fragment loaders and P-to-A repacking (fragments.cuh), used by every backward kernel.
using step4::acc_to_a;
using step4::load_a;
using step4::load_b;
using step4::load_b_trans;
using step4::tile_offset;

// What the backward kernels need, passed by value. Tensors are contiguous [B, H, N, d].
struct BwdParams {
  AttnParams a;      // the forward's problem: q, k, v, o, lse (written by the forward), shapes, mask, dropout
  const void* dout;  // dO [B, Hq, Nq, d]
  float* dsum;       // D = rowsum(dO * O) [B, Hq, Nq], written by the preprocess kernel
  void* dq;          // [B, Hq, Nq, d]
  float* dq_accum;   // atomic variant only: dQ / scale in fp32 [B, Hq, Nq, d], zeroed before the dK/dV kernel
  void* dk;          // [B, Hkv, Nk, d]
  void* dv;          // [B, Hkv, Nk, d]
  float* dbias;      // with a bias (fp32): dBias itself, or, for a broadcast bias in the deterministic variant,
                     // dS_pre of every (b, h) [B, Hq, Nq, Nk] to sum (DBiasRows); nullptr otherwise
};

constexpr float kLog2e = 1.4426950408889634f;

// Score modifiers. Row i sees the keys [diag - left, diag + right] of 0 .. Nk-1, diag = input_pos + i
// (core/score_mod.h, visible_range), -1 a side without bound; the causal mask caps right at 0. The band
// moves right as i grows: what ModColumns builds on.
struct Band {
  int64_t left, right;
  __device__ explicit Band(const ScoreMod& m) : left(m.window_left), right(m.causal ? 0 : m.window_right) {}
};

// The dK/dV and atomic kernels hold S^T: a thread's scores belong to many queries, too many for one
// step4::ModRow each (the forward's and the dQ kernel's way). ModColumns keeps the first query's of a query
// tile, and at(i) shifts it to query i = q0 + di per element: band, diagonal and bias row move with i.
struct ModColumns {
  static constexpr int kFar = 1 << 20;  // beyond any key and any shift by a tile's di: "unbounded"
  int q0, Nq, Nk, lo0, hi0, diag0;  // query q0's keys [lo0, hi0] (Nk's end applied in at()) and diagonal
  const float* bias;                 // its bias row, or nullptr
  float slope;                       // its head's ALiBi slope

  template <class Mods>  // a step4::ScoreMods
  __device__ ModColumns(const Mods& mods, int b, int h, int q0_) : q0(q0_), Nq(mods.Nq), Nk(mods.Nk) {
    const step4::ModRow r = mods.row(b, h, q0);
    const Band band(mods.m);
    const int64_t diag = mods.m.input_pos + q0;
    auto clamp = [&](int64_t x) { return int(max(int64_t(-kFar), min(x, int64_t(Nk) + 1))); };  // same tests
    lo0 = band.left < 0 ? -kFar : clamp(diag - band.left);
    hi0 = band.right < 0 ? Nk + 1 : clamp(diag + band.right);
    diag0 = int(max(int64_t(-1) << 30, min(diag, int64_t(1) << 30)));  // j - diag stays an int (keys < 2^30);
                                                                      // only ALiBi distances past 2^30 change
    bias = r.bias;
    slope = r.slope;
  }
  // Query i's ModRow (i >= q0): nothing visible past the end of Q.
  __device__ __forceinline__ step4::ModRow at(int i) const {
    const int di = i - q0;
    return {lo0 + di, i < Nq ? min(hi0 + di, Nk - 1) : -1, diag0 + di, bias ? bias + int64_t(di) * Nk : nullptr, slope};
  }
};

// Where a kernel compiled with the bias puts dS_pre = dBias (docs/conventions.md) of one (b, h): rows [Nq, Nk],
// element (i, j) stored, or added with a float atomic (`add`) where other (b, h) add into the same element;
// past Nq or Nk, or without a base (no bias), nothing. dbias_rows() picks:
//   the dK/dV kernel (deterministic) stores into [B, Hq, Nq, Nk]: dBias itself, or for a broadcast bias a
//     workspace that preprocess.cuh's finish_dbias_kernel sums afterwards in a fixed order;
//   the atomic kernel (kBiasShaped) writes dBias itself, with the bias's strides (0 where it broadcasts):
//     it stores into a full bias, and adds into a broadcast one, zeroed before the kernel (a sum in
//     whatever order the blocks come: not the same bits every run, as its dQ).
// Either way the tiles a mask hides are never visited: their elements are zeroed by finish_dbias_kernel
// (or, where the atomic kernel adds, by the memset before it).
// A kernel moves the rows to its thread's first element once (at()), then puts each element at offsets
// known at compile time: a few registers, where a pointer per element would spill.
struct DBiasRows {
  float* base = nullptr;   // element (0, 0), or after at(i0, j0) element (i0, j0)
  int64_t pitch = 0;       // Nk
  int rows = 0, cols = 0;  // the rows and columns from there on (Nq - i0, Nk - j0)
  bool add = false;
  __device__ __forceinline__ DBiasRows at(int i0, int j0) const {
    return {base ? base + i0 * pitch + j0 : nullptr, pitch, rows - i0, cols - j0, add};
  }
  __device__ __forceinline__ void put(int di, int dj, float v) const {  // element (i0 + di, j0 + dj)
    if (!base || di >= rows || dj >= cols) return;
    float* to = base + di * pitch + dj;
    if (add) atomicAdd(to, v);
    else *to = v;
  }
};
template <class Mask>  // does a kernel with this mask type write dBias? Only ScoreMods with the bias compiled in
constexpr bool kWritesDBias = false;
template <int kMods>
constexpr bool kWritesDBias<step4::ScoreMods<kMods>> = (kMods & kModBias) != 0;
template <class Mask>  // does a kernel with this mask type need the softcap's derivative? Only ScoreMods with it
constexpr bool kHasSoftcap = false;
template <int kMods>
constexpr bool kHasSoftcap<step4::ScoreMods<kMods>> = (kMods & kModSoftcap) != 0;
template <bool kBiasShaped, class Mask>
__device__ __forceinline__ DBiasRows dbias_rows(const BwdParams& bp, const Mask& mods, int b, int h) {
  const AttnParams& p = bp.a;
  if constexpr (!kWritesDBias<Mask>) {
    return {};
  } else {
    if (!bp.dbias) return {};
    if (!kBiasShaped) return {bp.dbias + (int64_t(b) * p.Hq + h) * p.Nq * p.Nk, p.Nk, p.Nq, p.Nk, false};
    const bool add = (mods.bias_stride_b == 0 && p.B > 1) || (mods.bias_stride_h == 0 && p.Hq > 1);
    return {bp.dbias + b * mods.bias_stride_b + h * mods.bias_stride_h, p.Nk, p.Nq, p.Nk, add};
  }
}

// ---- the element-wise step: P and dS of one element, through the kernel's mask type ----
// A transposed tile's columns (S^T: a thread's scores belong to many queries): each query's Row for the mask's
// element test. CausalMask's Row is the query's index; ScoreMods' is ModColumns' shift of its first query's.
struct IndexColumns {
  __device__ __forceinline__ int at(int i) const { return i; }
};
__device__ __forceinline__ IndexColumns columns_of(const step4::CausalMask&, int, int, int) { return {}; }
template <int kMods>
__device__ __forceinline__ ModColumns columns_of(const step4::ScoreMods<kMods>& mods, int b, int h, int q0) {
  return ModColumns(mods, b, h, q0);
}

// P of one element, recomputed from its raw score s and the row's LSE (lse2, log2 units), and the factor dS
// takes from the score's modifier:
//   P = exp2(S' scale log2(e) - LSE log2(e)),  S' = s through the mask and modifiers;  factor = dS'/dX
// where X is the pre-softcap score (the softcap's derivative, core/score_mod.h softcap_grad_pre; 1 without a
// softcap). A hidden element has P = 0, selected, never computed into a NaN. A row past the end of Q (a tile's
// zero-filled rows) is given LSE = +inf by the kernels: its P = exp2(s - inf) = 0 in every tile, with or
// without the test, and its dS with it (its dO and D are 0). kTest: the tile needs the mask's
// element test (mask.h's needs); a mask that changes values (a bias, ALiBi, a softcap) always tests.
struct Prob {
  float p, grad;
};
template <class Mask>  // from the pre-softcap score X (-inf where hidden): ScoreMods' pre()
__device__ __forceinline__ Prob probability_pre(const Mask& mask, float x, float lse2, float scale_log2) {
  return {x == -INFINITY ? 0.0f : ptx::exp2_approx(fmaf(mask.cap(x), scale_log2, -lse2)), mask.grad(x)};
}
template <bool kTest, class Mask>
__device__ __forceinline__ Prob probability(const Mask& mask, float s, const typename Mask::Row& r, int j, float lse2,
                                            float scale_log2) {
  if constexpr (Mask::kChangesValues) {
    return probability_pre(mask, mask.pre(s, r, j), lse2, scale_log2);
  } else {
    const bool vis = !kTest || mask.visible(r, j);
    return {vis ? ptx::exp2_approx(fmaf(s, scale_log2, -lse2)) : 0.0f, 1.0f};
  }
}
// dS of one element and the P that multiplies dO: with dropout's Z (0 or 1/(1-p); 1 without) and the row's D,
//   P Z,   dS = P (dP Z - D) times the modifier's factor        (FlashAttention-2, Algorithm 2)
struct PdS {
  float pz, ds;
};
__device__ __forceinline__ PdS p_and_ds(Prob pr, float dp, float z, float d) {
  return {pr.p * z, pr.p * (dp * z - d) * pr.grad};
}

// The same three patterns as operands of a warp: a tile's base and the warp's first row (A, B) or head-dim
// column (B.trans), then fragments at compile-time steps i (rows or columns) and kk. Two ways to form the
// addresses, the same bytes (the atomic kernel's XorSteps, traits.h, picks):
//   plain      step 4's load_a / load_b / load_b_trans: the whole swizzle at each load, left to the compiler.
//   XOR steps  this lane's first address once; because the 128-byte swizzle XORs the 16-byte chunk index
//              (address bits 4-6) with row % 8 and tiles start on 1024 bytes, a step of 8k rows is an add
//              (row % 8 unchanged) and a step of dcol columns inside a panel an XOR of those bits: one
//              instruction or none per ldmatrix, at the price of lane addresses held in registers. It needs
//              the first row to be a multiple of 8 and the first column's chunk bits disjoint from the
//              steps' (a multiple of a power of two larger than they are).
// Which is faster depends on the kernel's register pressure; measured per configuration (docs/history/step5.md#xor-stepped-ldmatrix-addresses-log-row-20).
enum class Frag { kA, kB, kBTrans };
template <int Rows, Frag kFrag, bool kXorSteps>
struct Operand {
  uint32_t addr;  // with XOR steps, this lane's address of the first fragment; otherwise the tile's base
  int first;      // otherwise, the warp's first row or column
  __device__ __forceinline__ Operand(uint32_t base, int first_) : addr(base), first(first_) {
    const int lane = threadIdx.x % 32;
    if constexpr (kXorSteps && kFrag == Frag::kA)
      addr = base + uint32_t(first_ * 128) + tile_offset<Rows>(lane & 15, (lane >> 4) * 8);
    else if constexpr (kXorSteps && kFrag == Frag::kB)
      addr = base + uint32_t(first_ * 128) + tile_offset<Rows>((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
    else if constexpr (kXorSteps)
      addr = base + tile_offset<Rows>((lane & 7) + ((lane >> 3) & 1) * 8, first_ + (lane >> 4) * 8);
  }
  // A: rows first + i .. +15, k = 16kk; B: n = rows first + i .. +15, k = 16kk; B.trans: k = rows 16kk .. +15,
  // n = columns first + i .. +15.
  __device__ __forceinline__ void load(uint32_t (&f)[4], int i, int kk) const {
    if constexpr (!kXorSteps) {
      if constexpr (kFrag == Frag::kA) load_a<Rows>(f, addr, first + i, kk);
      else if constexpr (kFrag == Frag::kB) load_b<Rows>(f, addr, first + i, kk);
      else load_b_trans<Rows>(f, addr, kk, first + i);
    } else {
      const int drow = kFrag == Frag::kBTrans ? 16 * kk : i, dcol = kFrag == Frag::kBTrans ? i : 16 * kk;
      const uint32_t a = (addr ^ uint32_t((dcol % 64) / 8 << 4)) + uint32_t((dcol / 64) * Rows * 128 + drow * 128);
      if constexpr (kFrag == Frag::kBTrans) ptx::ldmatrix_x4_trans(f, a);
      else ptx::ldmatrix_x4(f, a);
    }
  }
};

// Stores a warp's [16, 8 NT] fp32 accumulator tile (rows row0 + g, row0 + g + 8; columns col0 + 8nd + 2t,
// +1), times `mul`, as 16-bit pairs into the [N, D] matrix `out` whose rows lie `stride` elements apart (D:
// contiguous; a packed batch's interleave its heads: packed_rows.h); rows >= N are skipped. Every element of
// the tile is written by exactly one thread: no atomics, the same bits every run.
template <typename T, int D, int NT>
__device__ __forceinline__ void store_rows(T* out, const float (&acc)[NT][4], int64_t row0, int64_t N, float mul,
                                           int col0 = 0, int64_t stride = D) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= N) continue;
    uint32_t* dst = reinterpret_cast<uint32_t*>(out + row * stride + col0 + 2 * t);
#pragma unroll
    for (int nd = 0; nd < NT; ++nd) dst[nd * 4] = ptx::pack2<T>(acc[nd][2 * r] * mul, acc[nd][2 * r + 1] * mul);
  }
}

// The work of a block that owns the Bc keys k0 .. k0 + Bc - 1 of one KV head (the dK/dV kernel, the atomic
// kernel). Key tiles of one head are neighbours in the grid. The block visits the query tiles of Bq rows
// that see its keys, for every query head of its GQA group: all of them, or (causal) those from the first
// row whose diagonal reaches key k0 (row i sees key j iff j <= input_pos + i). Iteration `it` is query
// tile q0(it) / Bq of query head head(it). With `rotate`, the block starts that list at its own key tile's
// index (mod n_iter) and wraps around: the blocks of one head, which run side by side, then add their dQ
// into different rows at any one time (the atomic kernel). The order is fixed per block, so dK and dV
// are still summed in the same order every run. Which query tiles see the block's keys is the mask's trip
// count (mask.h, query_tiles: the causal mask, and 4e's sliding window).
struct KeyBlockWork {
  int b, hkv, bh_kv, k0;           // batch, KV head, their flat index, first key
  int m_first, per_head, n_iter;  // first query tile, tiles per query head, iterations in all
  int group, Bq, rot = 0;         // GQA group size, query tile height, first iteration's place

  // mask: the kernel's mask type (step 4's mask.h).
  template <class Mask>
  __device__ KeyBlockWork(const AttnParams& p, const Mask& mask, int Bc, int Bq_, bool rotate = false)
      : group(p.group), Bq(Bq_) {
    const int num_n = (p.Nk + Bc - 1) / Bc;
    bh_kv = blockIdx.x / num_n;
    hkv = bh_kv % p.Hkv;
    b = bh_kv / p.Hkv;
    k0 = (blockIdx.x % num_n) * Bc;
    const TileRange rows = mask.query_tiles(k0, Bc, Bq);  // the query tiles whose rows see a key of [k0, k0 + Bc)
    m_first = rows.begin;
    per_head = rows.count();
    n_iter = per_head * group;
    if (rotate && n_iter > 0) rot = (blockIdx.x % num_n) % n_iter;
  }
  __device__ int order(int it) const { return it + rot < n_iter ? it + rot : it + rot - n_iter; }  // place in the list
  __device__ int head(int it) const { return hkv * group + order(it) / per_head; }   // query head of iteration it
  __device__ int q0(int it) const { return (m_first + order(it) % per_head) * Bq; }  // its first query row
};

// Two tiles at the same tensor coordinates (K and V, or Q and dO; Tile: step 4's PanelTile) into dst_a and
// dst_b, every copy signalling `bar`, which the caller has made expect both (2 Tile::kBytes): the backward
// always needs such a pair at once. Panel by panel, so both tensors' panel c leave together.
template <class Tile>
__device__ __forceinline__ void tma_load_pair(void* dst_a, const void* tm_a, void* dst_b, const void* tm_b, int row,
                                              int bh, uint64_t* bar) {
#pragma unroll
  for (int c = 0; c < Tile::kPanels; ++c) {
    ptx::tma_load_3d(static_cast<uint8_t*>(dst_a) + Tile::panel(c), tm_a, c * Tile::kPanelCols, row, bh, bar);
    ptx::tma_load_3d(static_cast<uint8_t*>(dst_b) + Tile::panel(c), tm_b, c * Tile::kPanelCols, row, bh, bar);
  }
}

// The producer: iteration it's Q and dO tiles (the order of KeyBlockWork) into their slot of the Q/dO ring
// (step 4's TmaRing). Smem is the kernel's shared-memory type, with q and dout rings of Tr::kStages slots;
// Rows says where the tile is (packed_rows.h: the dense layout, or a packed batch's).
template <class Tr, class Smem, class Ring, class Rows = DenseRows>
__device__ __forceinline__ void load_q_do(Smem& sm, const Ring& ring, const KeyBlockWork& w, int Hq, int it,
                                          const CUtensorMap* tm_q, const CUtensorMap* tm_do, const Rows& rows = {}) {
  const step4::KvTileAt at = rows.q_tile(w.b, w.b * Hq + w.head(it), w.q0(it));
  uint64_t* bar = ring.expect(it, 2 * Tr::kQBytes);  // Q and dO: one barrier for both tiles
  tma_load_pair<typename Tr::QTile>(sm.q[ring.slot(it)], tm_q, sm.dout[ring.slot(it)], tm_do, at.row, at.bh, bar);
}

}  // namespace fa::step5
