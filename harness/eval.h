// FlashAttention, step by step — harness/eval.h
// Evaluating a stage: the check against the oracle under the tolerance rule, and timing. The CLI
// (harness/cli.h), the tests, the tour and the autotuner (step 6) all use these.
#pragma once
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/random.h"
#include "core/stage.h"

namespace fa {

struct CheckReport {
  ErrorStats stage[6], baseline[6];  // O, LSE, dQ, dK, dV, dBias
  Verdict verdict[6];
  int n = 2;                         // 2 (forward), 5 (with backward) or 6 (a backward with a bias)
  bool pass = true;
  static const char* name(int k);
};
// Compares `got` with the oracle's exact outputs under the tolerance rule (baseline: the oracle's naive
// computation in the problem's dtype). The oracle is step 1's (step1::oracle()).
CheckReport check_against(const Oracle& oracle, const Problem& p, const Inputs& in, const Outputs& got);

double median(std::vector<double> v);  // the upper median; 0 for an empty list

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
  int reps = 0;
};
// Median of warmed-up runs: the stage's platform times a GPU stage (device events, L2 flushed before
// each run), a steady clock a CPU stage. Set-up (the Runner's construction) is never inside the timed region.
Timing time_runner(Runner& r, const Stage& s, bool backward);

// The stage's device ("NVIDIA H100 80GB HBM3", or the CPU's model name) and its runtime version ("13.0";
// "" for a CPU stage), for the JSON records.
std::string device_name(const Stage& s);
std::string runtime_version(const Stage& s);
// The git revision of the sources this binary was built from (refreshed at every build).
std::string git_revision();

}  // namespace fa
