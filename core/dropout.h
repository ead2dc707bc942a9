// FlashAttention, step by step — core/dropout.h
// The dropout mask: one pure function of (seed, b, h, i, j), the same on host and device, so the
// reference, every forward kernel and every backward kernel agree on which weights were dropped
// without ever storing the mask.
//
// Layout (docs/conventions.md): Random123's Philox4x32-10 with
//   key     = { seed & 0xffffffff, seed >> 32 }
//   counter = { j / 4, i, h, b }      (j: key column, i: query row, h: query head, b: batch)
// gives four 32-bit words; word (j % 4) decides element (b, h, i, j). The weight is kept iff
//   word >= threshold,  threshold = round(p * 2^32)   (so P(keep) = 1 - p),
// and kept weights are scaled by 1 / (1 - p).
#pragma once
#include <cstdint>

#include <Random123/philox.h>

#include "core/hd.h"

namespace fa {

struct DropoutParams {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // drop iff philox word < threshold; 0 disables dropout
  float keep_scale = 1.0f; // 1 / (1 - p)
};

inline DropoutParams make_dropout(float p, uint64_t seed) {
  DropoutParams d;
  d.seed = seed;
  const double t = double(p) * 4294967296.0 + 0.5;
  d.threshold = p <= 0.0f ? 0u : (t >= 4294967295.0 ? 4294967295u : uint32_t(t));
  d.keep_scale = 1.0f / (1.0f - p);
  return d;
}

// The four Philox words for columns 4*j4 .. 4*j4+3 of row (b, h, i).
FA_HD r123::Philox4x32::ctr_type dropout_words(uint64_t seed, uint32_t b, uint32_t h, uint32_t i, uint32_t j4) {
  r123::Philox4x32 rng;
  r123::Philox4x32::ctr_type ctr = {{j4, i, h, b}};
  r123::Philox4x32::key_type key = {{uint32_t(seed), uint32_t(seed >> 32)}};
  return rng(ctr, key);
}

// Is element (b, h, i, j) kept?
FA_HD bool dropout_keep(const DropoutParams& d, uint32_t b, uint32_t h, uint32_t i, uint32_t j) {
  if (d.threshold == 0) return true;
  const auto w = dropout_words(d.seed, b, h, i, j >> 2);
  return w.v[j & 3] >= d.threshold;
}

}  // namespace fa
