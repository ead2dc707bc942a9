// FlashAttention, step by step — core/random.h
// Seeded random inputs: normal with a non-zero mean (never zeros: zeros hide unwritten outputs and wrong
// indexing), rounded to the problem's dtype so every stage and the reference see the same values.
#pragma once
#include <cstdint>

#include "core/problem.h"
#include "core/stage.h"
#include "core/tensor.h"

namespace fa {

// N(mean, 1) values; `stream` separates tensors drawn from one seed (q, k, v, dO).
Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, uint64_t stream, float mean, DType round);

// Rounds every element to `t` in place.
void round_tensor(Tensor& x, DType t);

// Seeded random inputs of a problem: Q, K, V (and dO for a backward), each its own stream of p.seed.
Inputs random_inputs(const Problem& p);

}  // namespace fa
