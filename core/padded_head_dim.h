// FlashAttention, step by step — core/padded_head_dim.h
// Head dims a stage's kernels are not compiled for, run on the next one that is. The kernels of steps 3-7 are
// compiled for d = 64 and 128 (their tiles hold 64-column panels); a model with d = 32 or 96 (or any multiple
// of 8 below the largest) runs there with its inputs' last dimension zero-padded:
//   q, k, v, dO [.., d]  ->  [.., D]  (D: the smallest compiled head dim >= d; the softmax scale unchanged)
//   O, dQ, dK, dV [.., D] ->  [.., d]  (the padded columns dropped); the LSE and dBias have no head dim.
// Exact: a zero column adds 0 to every score q . k, so S, P, the LSE and dS are those of the unpadded problem,
// and O, dQ, dK and dV get zero columns, which are dropped. The price is the padded columns' work and memory:
// d = 96 costs what d = 128 does. (Kernels of their own for 32, 96 and 256 are the better answer, not yet here.)
// The wrapper is host code over a Stage's callbacks (core/stage.h), so every GPU stage takes it alike, and a
// host test checks it on a CPU stage in CI.
#pragma once
#include <cstdint>
#include <vector>

#include "core/stage.h"
#include "core/tensor.h"

namespace fa {

// The smallest head dim of `compiled` that is >= d, for d a positive multiple of 8; 0 when there is none.
int64_t padded_head_dim(int64_t d, const std::vector<int64_t>& compiled);
// x with its last dimension, of size d, zero-padded to D (D >= d), or cropped to D (D < d): a copy.
Tensor resize_last_dim(const Tensor& x, int64_t D);
// s, which also takes every multiple of 8 up to its largest compiled head dim (s.supports.head_dims, which it
// then lists): make, make_varlen, unsupported, config_of, launch_shape and tuning_splits see the padded
// problem where p.d is not compiled. A head dim it cannot pad is refused with the reason.
Stage with_padded_head_dims(Stage s);

}  // namespace fa
