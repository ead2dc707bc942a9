// FlashAttention, step by step — step 1: the CPU reference (step1_cpu_reference/reference.h)
//
// What it is: attention exactly as the textbook writes it, with every intermediate materialised.
// It is the oracle every later stage is checked against (run in fp64), and, run in float with the
// roundings of a low-precision framework, the baseline of the tolerance rule (core/metrics.h).
//
// Forward, per batch b and query head h (KV head h / group):
//   S = scale * Q K^T                         [Nq, Nk]
//   S = modify(S) (+ bias, + ALiBi, softcap)  [Nq, Nk]   core/score_mod.h; masked entries (causal, window) = -inf
//   P = softmax(S) = exp(S - rowmax) / rowsum [Nq, Nk]   the 3-pass "safe" softmax
//   LSE = rowmax + log(rowsum)                [Nq]
//   Pd = P * Z / (1 - p)                      [Nq, Nk]   Z = the Philox keep mask (core/dropout.h)
//   O = Pd V                                  [Nq, d]
// Backward, given dO [Nq, d]:
//   D = rowsum(dO * O)        dV = Pd^T dO      dPd = dO V^T      dP = dPd * Z / (1 - p)
//   dS = P * (dP - D) * softcap_grad(S)     dQ = scale dS K   dK = scale dS^T Q   dBias = dS
// with dK and dV summed over the query heads of each KV head's group (GQA), and dBias over the dimensions
// the bias broadcasts over.
//
// Limits: O(Nq * Nk) memory per head; that quadratic footprint is what FlashAttention removes.
#pragma once
#include "core/problem.h"
#include "core/stage.h"
#include "core/tensor.h"

namespace fa::step1 {

// O [B, Hq, Nq, d], LSE [B, Hq, Nq], and dQ, dK, dV when backward, in precision T.
template <typename T>
using Result = OutputsT<T>;

// `emulate` = fp32: plain arithmetic in T. bf16/fp16: round S, P, Pd, O, dPd, dP, dS and the gradients
// to that type after each step, as an eager framework computing in that precision would (T = float).
template <typename T>
Result<T> attention(const Problem& p, const Inputs& in, bool backward, DType emulate = DType::fp32);

extern template Result<float> attention<float>(const Problem&, const Inputs&, bool, DType);
extern template Result<double> attention<double>(const Problem&, const Inputs&, bool, DType);

// Bytes attention<T> allocates for p (element_bytes = sizeof(T)): the matrices of the threads running at
// once, each holding four [Nq, Nk] matrices (seven with the backward), and the outputs. The harness refuses
// a problem whose need exceeds the machine's available memory before running it (core/host_memory.h).
double memory_needed(const Problem& p, bool backward, size_t element_bytes);

// The registry entry of this stage.
Stage stage();

// The oracle of --check and of the tests: attention<double>, and attention<float> emulating the problem's
// dtype as the tolerance rule's baseline (core/metrics.h).
Oracle oracle();

}  // namespace fa::step1
