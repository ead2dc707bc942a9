// FlashAttention, step by step — step 2: the worked example the traces share (step2_online_softmax/trace.h)
//
// N = 6 queries and keys, d = 2, an on-chip budget of M = 20 floats, so Bc = ceil(20 / 8) = 3 and
// Br = min(3, 2) = 2: three Q blocks, two K/V blocks. Three traces walk it, each through the real function
// and its visit observer, never a copy of the algorithm:
//   trace.cpp           FlashAttention-2's forward (attention_fa2), with and without the causal mask, then split-KV
//   trace_fa1.cpp       FlashAttention-1's forward (attention_fa1), K/V blocks outer, with dropout
//   trace_backward.cpp  the kv-outer backward (backward_kv_outer), with and without the causal mask
// Each ends by comparing with step 1's whole-matrix attention. The output is deterministic: tests/golden/
// holds one file per trace.
#pragma once
#include <cstdint>
#include <string>

#include "tiles.h"

namespace fa::step2::example {

constexpr int64_t kN = 6, kD = 2, kM = 20;

// The example as a problem: B = Hq = Hkv = 1, N = 6, d = 2, fp32, scale 1/sqrt(d), and the given mask and
// dropout; with `backward`, dO is part of its inputs.
Problem problem(uint64_t seed, bool causal = false, float dropout = 0.0f, bool backward = false);

// Its inputs, drawn as the harness's random_inputs draws them (Q, K, V; dO with p.backward).
Inputs inputs(const Problem& p);

// Its output buffers: O [1, 1, N, d] and LSE [1, 1, N]; with p.backward also dQ, dK, dV [1, 1, N, d].
Outputs outputs(const Problem& p);

// n numbers, "%8.4f" each (no "-0.0000": a value that rounds to zero prints as 0.0000).
void nums(std::string& s, const float* x, int64_t n);

// The opening lines every trace shares: `title`, the block sizes, the scale, the seed and the inputs, one
// row per position (with dO when the inputs have it).
void print_example(std::string& s, const std::string& title, const Problem& p, const Inputs& in);

}  // namespace fa::step2::example
