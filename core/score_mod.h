// FlashAttention, step by step — core/score_mod.h
// Score modifiers and masks (docs/conventions.md, "Score modifiers and masks"): FlexAttention's idea that
// a score passes through one modifier and one mask, at one place, with the same definitions in the forward,
// the backward, the reference and (later) the kernels. This file adds that one place:
//
//   s   = scale * q.k  +  bias[b, h, i, j]  +  alibi_h(i, j)        the pre-softcap score
//   s   = c * tanh(s / c)                                          softcap (c > 0; off when c = 0)
//   s   = -inf  unless visible(i, j)                               causal AND sliding window
//   P   = softmax(s)
//
// Everything is free when off: modify() adds a zero bias and skips what is disabled, visible() is the
// causal rule of core/problem.h when there is no window.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/problem.h"

namespace fa {

struct ScoreMod {
  bool causal = false;
  int64_t input_pos = 0;   // absolute position of query row 0: where the diagonal of every rule sits
  int64_t Hq = 1;          // query heads: the ALiBi slopes are a series over them
  bool alibi = false;      // add -slope_h * |j - (input_pos + i)| (FlashAttention's alibi_slopes)
  const float* slopes = nullptr;  // with alibi: the slope of each query head [Hq]; nullptr: the standard series
  float softcap = 0.0f;    // c of c * tanh(s / c); 0: off
  int64_t window_left = -1, window_right = -1;  // keys before / after the diagonal; -1: unbounded
};

// The modifiers of p; `slopes` are the ALiBi slopes given as an input (Inputs::alibi_slopes), if any.
inline ScoreMod score_mod_of(const Problem& p, const float* slopes = nullptr) {
  ScoreMod m;
  m.causal = p.causal;
  m.input_pos = p.input_pos;
  m.Hq = p.Hq;
  m.alibi = p.alibi;
  m.slopes = p.alibi ? slopes : nullptr;
  m.softcap = p.softcap;
  m.window_left = p.window_left;
  m.window_right = p.window_right;
  return m;
}

// The standard ALiBi slope of query head h among n heads (Press et al., and FlashAttention's tests):
// n a power of two: 2^(-8 (h+1) / n). Otherwise, with m the largest power of two below n, the first m heads
// take the series for m, and the other n - m heads every other term of the series for 2m:
// 2^(-4 (2k+1) / m), k = 0 .. n-m-1. Rounded to float: the slope a kernel would be given.
FA_HD float alibi_slope(int64_t h, int64_t n) {
  int64_t m = 1;
  while (m * 2 <= n) m *= 2;
  if (h < m) return float(exp2(-8.0 * double(h + 1) / double(m)));
  return float(exp2(-4.0 * double(2 * (h - m) + 1) / double(m)));
}

// Is key j visible to query row i?  The causal rule (core/problem.h: sees) and the window, which is
// aligned like it: (input_pos + i) - left <= j <= (input_pos + i) + right, a side of -1 unbounded.
FA_HD bool visible(const ScoreMod& m, int64_t i, int64_t j) {
  const int64_t diag = m.input_pos + i;
  if (!sees(m.causal, m.input_pos, i, j)) return false;
  if (m.window_left >= 0 && j < diag - m.window_left) return false;
  if (m.window_right >= 0 && j > diag + m.window_right) return false;
  return true;
}

// The visible keys of row i as the range [*lo, *hi] of 0 .. Nk-1 (empty when *lo > *hi): the mask is one
// band per row, whatever the flags, so a range says it (what the FLOP count and a tile skipper need).
FA_HD void visible_range(const ScoreMod& m, int64_t Nk, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t diag = m.input_pos + i;
  int64_t a = 0, b = Nk - 1;
  if (m.causal && diag < b) b = diag;
  if (m.window_right >= 0 && diag + m.window_right < b) b = diag + m.window_right;
  if (m.window_left >= 0 && diag - m.window_left > a) a = diag - m.window_left;
  *lo = a;
  *hi = b;
}

// Which value modifiers a caller compiled in (a kernel's kMods, step4_fused_pipelined/score_mod.cuh): the
// others are skipped without a test, and a lone one is applied without testing its flag. kModifyAny (the
// host, and a kernel built for any combination) tests each flag at run time.
enum ModBits : int { kModMask = 1, kModBias = 2, kModAlibi = 4, kModSoftcap = 8, kModifyAny = 14 };

// tanh for the softcap: the hardware's MUFU.TANH (tanh.approx.f32, relative error about 2^-11, far below
// a bf16 score's rounding) in a kernel's float scores; std::tanh elsewhere (the host, and fp64).
template <typename T>
FA_HD T softcap_tanh(T x) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == sizeof(float)) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(float(x)));
    return T(y);
  }
#endif
  return std::tanh(x);
}

// The score after the modifier, before the mask: s is scale * q.k (already scaled), `bias` the element of
// the bias tensor for (b, h, i, j) or 0, `slope` the ALiBi slope of query head h (read only with m.alibi),
// `dist` = j - (input_pos + i), the key's distance from the row's diagonal. A -inf score (a -inf bias: a
// mask given as a bias) stays -inf through the softcap, where c * tanh(-inf / c) would make it -c and
// unmask it. The one definition; the overloads below look up what a kernel keeps per row.
// modify_at is the two halves below, in this order: the terms added to the score (bias, ALiBi), then the
// softcap. A backward that needs the softcap's derivative keeps the pre-softcap score between them.
template <int kWhich = kModifyAny, typename T, typename Dist>
FA_HD T modify_pre_at(const ScoreMod& m, T s, T bias, float slope, Dist dist) {
  constexpr bool kLone = kWhich == kModBias || kWhich == kModAlibi || kWhich == kModSoftcap;
  if constexpr ((kWhich & kModBias) != 0) s += bias;
  if constexpr ((kWhich & kModAlibi) != 0)
    if (kLone || m.alibi) s -= T(slope) * T(dist < 0 ? -dist : dist);
  return s;
}
template <int kWhich = kModifyAny, typename T>
FA_HD T softcap_at(const ScoreMod& m, T s) {
  constexpr bool kLone = kWhich == kModBias || kWhich == kModAlibi || kWhich == kModSoftcap;
  // Only a bias can make s -inf here (a masked score never reaches modify): without one, no test.
  if constexpr ((kWhich & kModSoftcap) != 0)
    if ((kLone || m.softcap > 0.0f) && ((kWhich & kModBias) == 0 || s != -T(INFINITY)))
      s = T(m.softcap) * softcap_tanh(s * (T(1) / T(m.softcap)));  // times 1/c, not / c: a kernel hoists 1/c
  return s;
}
template <int kWhich = kModifyAny, typename T, typename Dist>
FA_HD T modify_at(const ScoreMod& m, T s, T bias, float slope, Dist dist) {
  return softcap_at<kWhich>(m, modify_pre_at<kWhich>(m, s, bias, slope, dist));
}
// The ALiBi slope of query head h: the given one, or the standard series.
FA_HD float head_slope(const ScoreMod& m, int64_t h) {
  return !m.alibi ? 0.0f : m.slopes ? m.slopes[h] : alibi_slope(h, m.Hq);
}
template <typename T>
FA_HD T modify_with_slope(const ScoreMod& m, T s, T bias, float slope, int64_t i, int64_t j) {
  return modify_at(m, s, bias, slope, j - (m.input_pos + i));
}
template <typename T>
FA_HD T modify(const ScoreMod& m, T s, T bias, int64_t h, int64_t i, int64_t j) {
  return modify_with_slope(m, s, bias, head_slope(m, h), i, j);
}

// Does the modifier change the value of a visible score (a bias, ALiBi or a softcap)? Without, only
// the mask acts, and a kernel can leave the tiles the mask does not cut untouched.
FA_HD bool changes_values(const ScoreMod& m, bool has_bias) { return has_bias || m.alibi || m.softcap > 0.0f; }

// Is every key of [k0, k0 + cols) visible to every row of [i0, i1], and inside K? The band of visible keys
// moves right as i grows, so the first row bounds the right edge and the last row the left one. A tile for
// which this holds needs no mask (with no value modifier, no per-element work at all).
FA_HD bool tile_all_visible(const ScoreMod& m, int64_t Nk, int64_t i0, int64_t i1, int64_t k0, int64_t cols) {
  int64_t lo0, hi0, lo1, hi1;
  visible_range(m, Nk, i0, &lo0, &hi0);
  visible_range(m, Nk, i1, &lo1, &hi1);
  return k0 + cols - 1 <= hi0 && lo1 <= k0;
}

// The softcap's derivative d(capped)/d(pre-softcap) = 1 - tanh^2(s_pre / c), written with the capped
// score s = c * tanh(s_pre / c) as 1 - (s / c)^2, so that the backward needs only the score it recomputes.
// 1 when the softcap is off. It multiplies dS = P * (dP - D) before dS reaches dQ, dK and dBias.
// For the host's references (fp64, and float with an exact tanh). Not for a kernel's scores: see below.
template <typename T>
FA_HD T softcap_grad(const ScoreMod& m, T s_capped) {
  if (!(m.softcap > 0.0f)) return T(1);
  if (s_capped == -T(INFINITY)) return T(0);  // a masked score: no gradient, and no 0 * inf = NaN
  const T t = s_capped / T(m.softcap);
  return T(1) - t * t;
}

// The same derivative from the pre-softcap score x, for the kernels: sech^2(x / c) = 4u / (1 + u)^2 with
// u = e^(-2|x| / c). Why not 1 - t^2 from the capped score: a kernel's t comes from tanh.approx, whose
// relative error of about 2^-11 is an absolute error of 2^-11 where tanh is near 1, and 1 - t^2 cancels
// there; once |x| passes a few c, the derivative (about 4 e^(-2|x|/c)) is as small as that error, so the
// derivative of a score far beyond the cap has no correct digit. ex2.approx's error is relative to u, so this
// form keeps its digits at any |x|. A -inf score (a bias's mask) gives u = 0: derivative 0, no NaN. kLone:
// the caller's kernel is compiled with the softcap alone (its flag is known to be on).
template <bool kLone = false, typename T>
FA_HD T softcap_grad_pre(const ScoreMod& m, T x) {
  if (!kLone && !(m.softcap > 0.0f)) return T(1);
  const T a = (x < T(0) ? -x : x) * (T(1) / T(m.softcap));
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == sizeof(float)) {
    float u;  // e^(-2a) = 2^(-2a log2(e))
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(u) : "f"(-2.8853900817779268f * float(a)));
    return T(__fdividef(4.0f * u, (1.0f + u) * (1.0f + u)));
  }
#endif
  const T u = std::exp(T(-2) * a);
  return T(4) * u / ((T(1) + u) * (T(1) + u));
}

}  // namespace fa
