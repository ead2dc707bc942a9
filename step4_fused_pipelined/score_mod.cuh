// FlashAttention, step by step — step 4e: score modifiers and masks as a mask policy (step4_fused_pipelined/score_mod.cuh)
//
// What it adds over 4d: core/score_mod.h's modifier (bias, ALiBi, softcap) and mask (causal and sliding
// window) on the scores a kernel holds in registers. ScoreMods is a mask type with mask.h's interface (the
// trip count, the tile test, the element), so 4d's kernel runs it unchanged, and so do split-KV (4f) and the
// backward (step 5): prepare.cuh passes MaskFor<kMods> as the kernel's Mask. kMods = 0: CausalMask, the
// kernel is what it was; otherwise the mask alone, the mask with one value modifier (its kernel knows which at
// compile time), or the mask with any of them (tested at run time): mods_kind() picks. The scores of a tile
// pass through ScoreMods before the softmax, and only where needed:
//   a bias, ALiBi or a softcap changes every visible score: every tile passes through, element by element;
//   a mask alone (causal, window, the end of K) only cuts the tiles it crosses: the others pass untouched,
//   and the scheduler never visits tiles wholly outside the window (key_tiles and query_tiles below).
// Units: step 4's softmax keeps scores in raw units q.k and folds the scale into exp2 (softmax.h). The
// modifier is defined on scaled scores; in raw units it is the same modifier with every constant divided
// by the scale (bias / scale, slope / scale, c / scale: c tanh(scale s / c) / scale = c' tanh(s / c')):
//     s' = modify(scale * s) / scale = modify_raw(s)          (masked: -inf)
// so no score is multiplied by the scale and back, and the softmax, the LSE and step 5's recomputation of
// P = exp2(s' scale log2(e) - LSE log2(e)) stay as they are. The backward multiplies dS by the softcap's
// derivative sech^2(x / c) = sech^2(x' / c') at the pre-softcap score x' (grad()), and dBias is that dS
// (docs/conventions.md).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/score_mod.h"
#include "core/tile_range.h"
#include "gpu/attn_params.h"
#include "step4_fused_pipelined/mask.h"

namespace fa::step4 {

// One query row as the modifier sees it, in 32-bit registers: the keys [lo, hi] it sees (core/score_mod.h's
// visible_range: causal, window and the end of K; empty past the end of Q), its diagonal input_pos + i
// (ALiBi's distances are from it), the bias row [Nk] of its (batch, head) or nullptr, its head's slope in
// raw units (slope / scale, below).
struct ModRow {
  int lo, hi, diag;
  const float* bias;
  float slope;
};

// The kernels a problem runs: kMods = 0, the plain kernel; otherwise kModMask plus the value modifiers
// (core/score_mod.h's ModBits) compiled in. One value modifier alone gets a kernel of its own, in which its
// flag is known at compile time; two or more take the kernel that tests each at run time (kModAll).
constexpr int kModAll = kModMask | kModifyAny;
inline int mods_kind(const Problem& p) {
  if (!p.has_score_mods()) return 0;
  const int v = (p.bias ? kModBias : 0) | (p.alibi ? kModAlibi : 0) | (p.softcap > 0.0f ? kModSoftcap : 0);
  return (v & (v - 1)) == 0 ? kModMask | v : kModAll;  // none or one value modifier: its own kernel
}

// Calls f(std::integral_constant<int, kind>{}): a launcher's way from mods_kind(p) to a kernel's kMods.
template <class F>
void dispatch_mods(int kind, F&& f) {
  switch (kind) {
    case 0: return f(std::integral_constant<int, 0>{});
    case kModMask: return f(std::integral_constant<int, kModMask>{});
    case kModMask | kModBias: return f(std::integral_constant<int, kModMask | kModBias>{});
    case kModMask | kModAlibi: return f(std::integral_constant<int, kModMask | kModAlibi>{});
    case kModMask | kModSoftcap: return f(std::integral_constant<int, kModMask | kModSoftcap>{});
    default: return f(std::integral_constant<int, kModAll>{});
  }
}

template <int kMods>
struct ScoreMods {
  static constexpr bool kChangesValues = (kMods & kModifyAny) != 0;  // mask.h: every visible score changes
  static_assert(kMods == kModMask || kMods == (kModMask | kModBias) || kMods == (kModMask | kModAlibi) ||
                    kMods == (kModMask | kModSoftcap) || kMods == kModAll,
                "a kernel's modifiers: the mask alone, with one value modifier, or all of them");
  static constexpr int kValues = kMods & kModifyAny;  // the value modifiers compiled in (0: the mask alone)
  static constexpr bool kLone = kValues == kModBias || kValues == kModAlibi || kValues == kModSoftcap;
  ScoreMod m;  // in raw units: m.softcap is c / scale (the mask's fields are positions, unchanged)
  float scale, inv_scale;
  int Nq, Nk;
  const float* bias;                      // [B or 1, Hq or 1, Nq, Nk] or nullptr
  int64_t bias_stride_b, bias_stride_h;   // 0 along a broadcast dimension

  // Reads the modifier from device memory once (p.mods; only kernels compiled with kMods build one).
  __device__ explicit ScoreMods(const AttnParams& p) : scale(p.scale), inv_scale(1.0f / p.scale), Nq(p.Nq), Nk(p.Nk) {
    const ModParams mp = *p.mods;
    m = mp.mod;
    m.input_pos = p.input_pos;  // the diagonal of the problem the kernel runs: a packed batch's sequence has its own
    m.softcap *= inv_scale;
    bias = mp.bias;
    bias_stride_b = mp.bias_stride_b;
    bias_stride_h = mp.bias_stride_h;
  }

  // Row i of query head h in batch b: looked up once per kernel, outside the main loop. (Positions and key
  // indices are below 2^30, stage 4's limit; a diagonal beyond int's range is clamped, which changes no
  // visible key and only ALiBi distances of 2^31 and more.)
  __device__ ModRow row(int b, int h, int i) const {
    int64_t lo = 1, hi = 0;  // past the end of Q: nothing visible
    if (i < Nq) visible_range(m, Nk, i, &lo, &hi);
    const int64_t diag = m.input_pos + i;
    const float* row_bias = bias ? bias + b * bias_stride_b + h * bias_stride_h + int64_t(min(i, Nq - 1)) * Nk : nullptr;
    if (lo > hi) lo = 1, hi = 0;  // empty; else both in [0, Nk - 1]
    return {int(lo), int(hi), int(max(min(diag, int64_t(INT32_MAX)), int64_t(INT32_MIN))), row_bias,
            head_slope(m, h) * inv_scale};  // the slope in raw units
  }

  // Score s (raw units) of row r, key j -> the modified score in raw units, or -inf where masked.
  __device__ __forceinline__ float operator()(float s, const ModRow& r, int j) const {
    if (!visible(r, j)) return -INFINITY;
    if constexpr (kValues == 0) return s;  // the mask alone
    else return cap(shifted(s, r, j));
  }

  // operator() in two halves, for a backward that needs the softcap's derivative: pre() adds the bias and
  // ALiBi (the pre-softcap score x, or -inf where masked), cap() applies the softcap to an x that is not
  // -inf (a caller tests x first: the softcap would turn a masked -inf into -c), grad() is the softcap's
  // derivative at x (core/score_mod.h, softcap_grad_pre; 1 in a kernel compiled without the softcap).
  __device__ __forceinline__ float pre(float s, const ModRow& r, int j) const {
    if (!visible(r, j)) return -INFINITY;
    return shifted(s, r, j);
  }
  __device__ __forceinline__ float cap(float x) const { return softcap_at<kValues>(m, x); }
  __device__ __forceinline__ float grad(float x) const {
    if constexpr ((kValues & kModSoftcap) == 0) return 1.0f;
    else return softcap_grad_pre<kLone>(m, x);
  }

  // The terms a visible score gains before the softcap (bias, ALiBi): x in raw units.
  __device__ __forceinline__ float shifted(float s, const ModRow& r, int j) const {
    if constexpr ((kValues & ~kModSoftcap) == 0) {
      return s;
    } else {
      float b = 0.0f;
      if constexpr ((kValues & kModBias) != 0)
        if (kLone || r.bias) b = __ldg(r.bias + j) * inv_scale;  // the bias in raw units
      return modify_pre_at<kValues>(m, s, b, r.slope, j - r.diag);
    }
  }

  // ---- mask.h's interface: the trip count, the tile test, the element test ----
  // The tiles a window and the causal mask leave (core/tile_range.h): a window may cut both ends.
  __device__ TileRange key_tiles(int first_row, int last_row, int Bc) const {
    return fa::key_tiles(m.causal, m.input_pos, Nk, first_row, last_row, Bc, &m);
  }
  __device__ TileRange query_tiles(int k0, int Bc, int Bq) const {
    return fa::query_tiles(m.causal, m.input_pos, Nq, Nk, k0, Bc, Bq, &m);
  }
  // The keys every row of [i0, i1] sees: the left edge of the last row to the right edge of the first
  // (the band moves right as i grows); empty when a row passes the end of Q. Once per warp.
  using Span = ModRow;
  __device__ Span span(int i0, int i1) const {
    ModRow c = row(0, 0, i1), first = row(0, 0, i0);
    c.hi = i1 < Nq ? min(c.hi, first.hi) : -1;
    return c;
  }
  // Must a tile of keys [k0, k0 + cols) pass through element by element, for rows whose common keys are
  // `c`? Yes with a value modifier; otherwise only when the mask or an end cuts it.
  __device__ __forceinline__ bool needs(const Span& c, int k0, int cols) const {
    return kValues != 0 || k0 < c.lo || k0 + cols - 1 > c.hi;
  }
  using Row = ModRow;
  __device__ __forceinline__ bool visible(const ModRow& r, int j) const { return j >= r.lo && j <= r.hi; }
};

// The mask type of a kernel compiled for modifiers kMods (0: none, the plain kernel's CausalMask).
template <int kMods>
using MaskFor = std::conditional_t<kMods == 0, CausalMask, ScoreMods<kMods == 0 ? kModMask : kMods>>;

}  // namespace fa::step4
