// FlashAttention, step by step — core/metrics.h
// Errors against the fp64 reference, and the FlashAttention tolerance rule:
//   a stage passes when  max|stage - ref| <= 2 * max|naive_lowprec - ref| + eps,
// where naive_lowprec is step 1 run in the stage's own precision (bf16/fp16 roundings of S, P, O, ...),
// and eps = 1e-5 * max(1, max|ref|). This is the rule of FlashAttention's own tests: a fused kernel may be
// at most twice as wrong as the textbook computation in the same precision.
#pragma once
#include <string>

#include "core/tensor.h"

namespace fa {

struct ErrorStats {
  double max_abs = 0;     // max |got - ref| over elements where both are finite or equal infinities
  double rel_l2 = 0;      // ||got - ref||_2 / ||ref||_2 over the finite elements
  double ref_max = 0;     // max |ref| over finite elements
  size_t unwritten = 0;   // NaN in `got` (outputs are poisoned with NaN before a run)
  size_t mismatched_inf = 0;  // -inf in one and not the other (LSE of fully masked rows)
  bool ok_shape = true;
};

ErrorStats compare(const Tensor& got, const TensorT<double>& ref);
ErrorStats compare(const Tensor& got, const Tensor& ref);

struct Verdict {
  bool pass;
  double tolerance;
};
// `stage` and `baseline` are errors of the stage and of the naive low-precision run against fp64.
Verdict tolerance_rule(const ErrorStats& stage, const ErrorStats& baseline);

}  // namespace fa
