// FlashAttention, step by step — core/problem.h
// The attention problem every stage solves, its validation and its FLOP count.
//
//   Q [B, Hq, Nq, d], K and V [B, Hkv, Nk, d]  ->  O [B, Hq, Nq, d], LSE [B, Hq, Nq]
//   S = scale * Q K^T, masked; P = softmax(S) (row-wise); O = dropout(P) V; LSE = log sum_j exp(S_ij)
//
// Semantics (docs/conventions.md): query row i sits at absolute position input_pos + i, key j at j;
// with `causal`, query i sees key j iff j <= input_pos + i. Query head h reads KV head h / (Hq / Hkv).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/hd.h"

namespace fa {

enum class DType { fp32, fp16, bf16 };
const char* dtype_name(DType t);
DType parse_dtype(const std::string& s);  // throws std::invalid_argument

// The shortest text that reads back as x ("0.1", "0.99999994", "-3", "inf"): a value shown in a message
// or a description is the value used, never one rounded into another (0.99999994 shown as "1").
std::string float_str(float x);

struct Problem {
  int64_t B = 1, Hq = 8, Hkv = 8;  // batch, query heads, key/value heads
  int64_t Nq = 1024, Nk = 1024;    // query and key sequence lengths
  int64_t d = 64;                  // head dimension
  bool causal = false;
  int64_t input_pos = 0;  // absolute position of query row 0 (resolved: Nk - Nq unless given)
  float scale = 0.125f;   // softmax scale (resolved: 1/sqrt(d) unless given)
  DType dtype = DType::bf16;
  float dropout = 0.0f;  // probability of dropping a weight
  uint64_t seed = 0;     // seeds the inputs and the dropout mask
  bool backward = false;
  int64_t splits = 0;    // split-KV: key ranges per head processed in parallel (0: chosen from the shape)
  // A KV cache (decoding): sequences that hold different numbers of keys, and the cache stored in pages.
  //   cache_seqlens  sequence b's keys are the first cache_seqlens[b] of its Nk rows of K and V (Nk is then
  //                  the cache's capacity); its queries keep their distance from its last key (input_pos
  //                  shifts by the keys it lacks: kv_input_pos), so bottom-right stays bottom-right. Empty:
  //                  every sequence holds Nk keys.
  //   page_size      > 0: a GPU stage stores K and V in pages of this many keys, found through a block table
  //                  (step 4's paged_kv.cuh); the values are those of the dense K and V. 0: contiguous.
  std::vector<int64_t> cache_seqlens;
  int64_t page_size = 0;
  // Score modifiers and masks (core/score_mod.h, docs/conventions.md); all off by default.
  bool bias = false;      // an additive bias [B or 1, Hq or 1, Nq, Nk] comes with the inputs (Inputs::bias)
  bool alibi = false;     // ALiBi: the standard slopes of Hq heads, or Inputs::alibi_slopes
  float softcap = 0.0f;   // s <- c * tanh(s / c); 0: off
  int64_t window_left = -1, window_right = -1;  // sliding window around the diagonal; -1: unbounded

  int64_t group() const { return Hq / Hkv; }  // query heads per KV head (GQA)
  bool has_kv_cache() const { return !cache_seqlens.empty() || page_size > 0; }
  int64_t kv_len(int64_t b) const { return cache_seqlens.empty() ? Nk : cache_seqlens[size_t(b)]; }
  int64_t kv_input_pos(int64_t b) const { return input_pos - (Nk - kv_len(b)); }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  bool has_score_mods() const { return bias || alibi || softcap > 0.0f || has_window(); }
  // Forward FLOPs: two matrix products of 2*Nq*Nk*d each per head, halved when causal (the convention of
  // FlashAttention's benchmarks, whatever the kernel really skips); with a window, 4*d per visible (i, j)
  // pair, counted exactly (FlashAttention's benchmark for windows). The backward counts 2.5x that.
  double flops_forward() const;
  double flops_backward() const { return 2.5 * flops_forward(); }
  // Throws std::invalid_argument with one clear sentence when the problem is malformed.
  void validate() const;
  std::string describe() const;
};

// Does query row i see key column j?  The one mask rule, shared by host and device.
FA_HD bool sees(bool causal, int64_t input_pos, int64_t i, int64_t j) { return !causal || j <= input_pos + i; }

// Number of keys row i sees (0 for a fully masked row).
FA_HD int64_t visible_keys(bool causal, int64_t input_pos, int64_t Nk, int64_t i) {
  if (!causal) return Nk;
  const int64_t last = input_pos + i;  // the last visible key
  return last < 0 ? 0 : (last + 1 < Nk ? last + 1 : Nk);
}

}  // namespace fa
