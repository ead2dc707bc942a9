// FlashAttention, step by step — core/tile_range.h
// Which tiles a block visits, as pure integer arithmetic on the mask: the K/V tiles a query tile's rows see
// (the forward: step 4's scheduler, 4f's splits, step 7; step 5's dQ kernel), and the query tiles whose rows
// see a block of keys (step 5's dK/dV and atomic kernels). FA_HD, so that the kernels and the host tests
// (tests/test_host_kernels.cpp) run the same code: a tile is in the range iff some (row, key) pair of it is
// visible (core/score_mod.h: visible), checked there against brute force.
//
// The visible keys of row i are one band [lo_i, hi_i] (core/score_mod.h: visible_range) whose ends never move
// left as i grows, and the bands of consecutive rows overlap or touch. So the keys a set of consecutive rows
// sees run from the first row's lo to the last row's hi, and the rows that see a set of consecutive keys run
// from the first whose right edge reaches the first key to the last whose left edge reaches the last key.
// These run once per block, before its loop: the int64 divisions here are not in any kernel's loop.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "core/score_mod.h"

namespace fa {

// Tiles begin .. end - 1 (of Bc keys, or of Bq query rows); empty when end == begin.
struct TileRange {
  int begin, end;
  FA_HD int count() const { return end - begin; }
};

// The K/V tiles of Bc keys that query rows first_row .. last_row (first_row <= last_row < Nq) see.
// Without `window`, the causal mask alone (every tile without it): what the plain kernels compile. With it
// (kernels compiled with the score modifiers, whose ScoreMod carries the causal flag and input_pos too), the
// sliding window as well, which may cut the left end: begin > 0. An empty range keeps the first row's begin.
FA_HD TileRange key_tiles(bool causal, int64_t input_pos, int64_t Nk, int64_t first_row, int64_t last_row, int Bc,
                          const ScoreMod* window = nullptr) {
  if (window) {
    int64_t lo_first, hi_first, lo_last, hi_last;
    visible_range(*window, Nk, first_row, &lo_first, &hi_first);
    visible_range(*window, Nk, last_row, &lo_last, &hi_last);
    const int begin = int(lo_first / Bc);
    return {begin, hi_last < lo_first ? begin : int(hi_last / Bc) + 1};
  }
  // Causal: up to the last row's diagonal (bottom-right alignment: row i sees key j iff j <= input_pos + i).
  const int64_t diag = input_pos + last_row;
  const int64_t last_key = causal ? (diag < Nk - 1 ? diag : Nk - 1) : Nk - 1;
  return {0, last_key < 0 ? 0 : int(last_key / Bc) + 1};
}

// The query tiles of Bq rows (of Nq) whose rows see a key of the block k0 .. min(k0 + Bc, Nk) - 1 (k0 < Nk).
// Without `window`, the causal mask alone (every tile without it): from the first row whose diagonal reaches
// k0. With it (score modifiers), the window too: from the first row whose right edge reaches k0 to the last
// whose left edge reaches the block's last key. The causal mask caps the right edge at the diagonal.
FA_HD TileRange query_tiles(bool causal, int64_t input_pos, int Nq, int Nk, int k0, int Bc, int Bq,
                            const ScoreMod* window = nullptr) {
  const int num_m = (Nq + Bq - 1) / Bq;
  if (window) {
    const int64_t left = window->window_left, right = window->causal ? 0 : window->window_right;  // -1: unbounded
    const int64_t k_last = (k0 + Bc < Nk ? k0 + Bc : Nk) - 1;
    const int64_t reach = int64_t(k0) - right - window->input_pos;  // the first row whose right edge reaches k0
    const int64_t first = right < 0 ? 0 : (reach > 0 ? reach : 0);
    const int64_t upto = k_last + left - window->input_pos;        // the last row whose left edge reaches k_last
    const int64_t last = left < 0 ? Nq - 1 : (upto < Nq - 1 ? upto : int64_t(Nq) - 1);
    if (first > last) return {0, 0};
    return {int(first / Bq), int(last / Bq) + 1};
  }
  if (!causal) return {0, num_m};
  const int64_t first_row = int64_t(k0) - input_pos > 0 ? int64_t(k0) - input_pos : 0;
  return {first_row >= Nq ? num_m : int(first_row / Bq), num_m};
}

// Split s's share of a query tile's K/V tiles `all`, `per_split` tiles to a split (split-KV, step 4f): from
// all.begin + s * per_split on, cut at all.end; empty for a split past the end (it writes the merge's identity).
FA_HD TileRange split_share(TileRange all, int s, int per_split) {
  const int begin = all.begin + s * per_split;
  const int end = all.end < begin + per_split ? all.end : begin + per_split;
  return {begin, end > begin ? end : begin};
}

}  // namespace fa
