// FlashAttention, step by step — harness/registry.h
// The one list of stages, in tutorial order, for what iterates them all: the tour, the tests and the
// benchmarks. A stage's own executable does not use it (its main hands its stage to the harness), so
// only what links this list carries every stage's kernels.
#pragma once
#include <string>
#include <vector>

#include "core/stage.h"
#include "harness/eval.h"

namespace fa {

// Every stage compiled into this build, in tutorial order.
const std::vector<Stage>& stages();
const Stage& find_stage(const std::string& name);  // throws std::invalid_argument if unknown

// Why the GPU stages cannot run here, in plain words ("" when they can): they were not built, there is no
// GPU or driver, the driver is older than the CUDA toolkit, or the GPU is not one the kernels are built for.
// A stage that needs more than that (step 7: a Hopper GPU) says so through its own platform: ask
// s.platform->unavailable_reason() before running stage s.
std::string gpu_unavailable_reason();

// Step 1's oracle, and the check against it (what the tests and the tour use).
const Oracle& reference_oracle();
CheckReport check_against_reference(const Problem& p, const Inputs& in, const Outputs& got);

// The hook behind --tuned: step 6's choice of configuration for stage s on problem p (tuned once, then
// cached), or an exception in a build without the GPU stages. Sets p.splits to a decode's tuned split count.
std::string tuned_variant(const Stage& s, Problem& p);

}  // namespace fa
