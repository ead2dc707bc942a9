// FlashAttention, step by step — core/metrics.h
// Errors against the fp64 reference, and the FlashAttention tolerance rule:
//   a stage passes when  max|stage - ref| <= 2 * max|naive_lowprec - ref| + eps,
// where naive_lowprec is step 1 run in the stage's own precision (bf16/fp16 roundings of S, P, O, ...),
// and eps = 1e-5 * max(1, max|ref|). This is the rule of FlashAttention's own tests: a fused kernel may be
// at most twice as wrong as the textbook computation in the same precision.
#pragma once
#include <cstring>
#include <string>

#include "core/tensor.h"

namespace fa {

// The poison a GPU runner fills its output buffers with before a run (gpu/cuda_util.cpp: every byte 0xff)
// reads back, whatever the storage type, as a NaN whose top 16 bits are all ones: 0xffffffff (fp32),
// 0xffff0000 (bf16) or 0xffffe000 (fp16, widened). A NaN that arithmetic produces never looks like that
// (the GPU's is 0x7fffffff, the CPU's 0xffc00000), so an element still holding the poison was not written.
inline bool is_poison(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits >> 16) == 0xffffu;
}

struct ErrorStats {
  double max_abs = 0;     // max |got - ref| over the elements where both are finite
  double rel_l2 = 0;      // ||got - ref||_2 / ||ref||_2 over the same elements
  double ref_max = 0;     // max |ref| over the finite elements
  size_t unwritten = 0;   // elements of `got` still holding the poison (is_poison): never written
  size_t nan = 0;         // other NaN in `got`: computed by the stage
  size_t ref_nan = 0;     // NaN in the reference itself: nothing to compare with there
  size_t mismatched_inf = 0;  // an infinity in one and not the same in the other (LSE of fully masked rows)
  bool ok_shape = true;
};

ErrorStats compare(const Tensor& got, const TensorT<double>& ref);
ErrorStats compare(const Tensor& got, const Tensor& ref);

struct Verdict {
  bool pass;
  double tolerance;
};
// `stage` and `baseline` are errors of the stage and of the naive low-precision run against fp64. Beyond
// the tolerance, a pass needs the right shape, every element written, no NaN on either side and matching
// infinities: an output compared over only some of its elements never passes.
Verdict tolerance_rule(const ErrorStats& stage, const ErrorStats& baseline);

}  // namespace fa
