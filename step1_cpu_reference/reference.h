// FlashAttention, step by step — step 1: the CPU reference (step1_cpu_reference/reference.h)
//
// What it is: attention exactly as the textbook writes it, with every intermediate materialised.
// It is the oracle every later stage is checked against (run in fp64), and, run in float with the
// roundings of a low-precision framework, the baseline of the tolerance rule (common/metrics.h).
//
// Forward, per batch b and query head h (KV head h / group):
//   S = scale * Q K^T                         [Nq, Nk]   masked entries = -inf
//   P = softmax(S) = exp(S - rowmax) / rowsum [Nq, Nk]   the 3-pass "safe" softmax
//   LSE = rowmax + log(rowsum)                [Nq]
//   Pd = P * Z / (1 - p)                      [Nq, Nk]   Z = the Philox keep mask (common/dropout.h)
//   O = Pd V                                  [Nq, d]
// Backward, given dO [Nq, d]:
//   D = rowsum(dO * O)        dV = Pd^T dO      dPd = dO V^T      dP = dPd * Z / (1 - p)
//   dS = P * (dP - D)         dQ = scale dS K   dK = scale dS^T Q
// with dK and dV summed over the query heads of each KV head's group (GQA).
//
// Limits: O(Nq * Nk) memory per head; that quadratic footprint is what FlashAttention removes.
#pragma once
#include "common/problem.h"
#include "common/stage.h"
#include "common/tensor.h"

namespace fa::step1 {

template <typename T>
struct Result {
  TensorT<T> o, lse;      // [B, Hq, Nq, d], [B, Hq, Nq]
  TensorT<T> dq, dk, dv;  // filled when backward
};

// `emulate` = fp32: plain arithmetic in T. bf16/fp16: round S, P, Pd, O, dPd, dP, dS and the gradients
// to that type after each step, as an eager framework computing in that precision would (T = float).
template <typename T>
Result<T> attention(const Problem& p, const Inputs& in, bool backward, DType emulate = DType::fp32);

extern template Result<float> attention<float>(const Problem&, const Inputs&, bool, DType);
extern template Result<double> attention<double>(const Problem&, const Inputs&, bool, DType);

// The registry entry of this stage.
Stage stage();

}  // namespace fa::step1
