// FlashAttention, step by step — common/eval.h
// Evaluating a stage: seeded inputs, the check against step 1 under the tolerance rule, and timing.
// The CLI (harness.h), the tests, the tour and the autotuner (step 6) all use these.
#pragma once
#include <string>
#include <vector>

#include "metrics.h"
#include "stage.h"

namespace fa {

// Seeded random inputs for a problem (the tests and the tour use this too).
Inputs random_inputs(const Problem& p);

struct CheckReport {
  ErrorStats stage[5], baseline[5];  // O, LSE, dQ, dK, dV
  Verdict verdict[5];
  int n = 2;                         // 2 (forward) or 5 (with backward)
  bool pass = true;
  static const char* name(int k);
};
// Compares `got` with step 1 in fp64 under the tolerance rule (baseline: step 1 in the problem's dtype).
CheckReport check_against_reference(const Problem& p, const Inputs& in, const Outputs& got);

double median(std::vector<double> v);  // the upper median; 0 for an empty list

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
  int reps = 0;
};
// Median of warmed-up runs: CUDA events around run() on the GPU (L2 flushed before each), a steady
// clock on the CPU. Set-up (the Runner's construction) is never inside the timed region.
Timing time_runner(Runner& r, const Stage& s, bool backward);

// "NVIDIA H100 80GB HBM3" or the CPU's model name, and the CUDA runtime version ("" without CUDA).
std::string device_name(bool gpu);
std::string cuda_version();
std::string git_revision();

}  // namespace fa
