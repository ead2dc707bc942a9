// FlashAttention, step by step — common/harness.h
// The one harness: the common command line of every stage executable, input set-up, the check against
// step 1, timing, dumps and JSON records.
#pragma once
#include <optional>
#include <string>

#include "metrics.h"
#include "stage.h"

namespace CLI {
class App;
}

namespace fa {

struct CommonOptions {
  Problem problem;                       // B, Hq, d, causal, dtype, dropout, seed, backward
  std::optional<int64_t> kv_heads, seq, seq_q, seq_k, input_pos;
  std::optional<float> scale;
  std::string dtype = "bf16";
  std::string variant;  // "" = the stage's default
  std::string inputs_dir, dump_dir, json_file;
  bool check = false, bench = false;
};

// Adds the flags every stage accepts (--batch ... --json) to `app`.
void add_common_options(CLI::App& app, CommonOptions& o);

// Resolves defaults (input_pos = Nk - Nq, scale = 1/sqrt(d)), reads --inputs or draws random inputs,
// validates. Throws std::invalid_argument / std::runtime_error with a clear message.
Inputs prepare_inputs(CommonOptions& o);

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

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
  int reps = 0;
};
// Median of warmed-up runs: CUDA events around run() on the GPU (L2 flushed before each), a steady
// clock on the CPU. Set-up (the Runner's construction) is never inside the timed region.
Timing time_runner(Runner& r, const Stage& s, bool backward);

// Runs one stage as its executable does: check, bench, dump, json. Returns the process exit code.
int run_stage(const Stage& s, CommonOptions& o);

// main() of a stage executable with no flags of its own.
int stage_main(const std::string& stage_name, int argc, char** argv);

// "NVIDIA H100 80GB HBM3" or the CPU's model name, and the CUDA runtime version ("" without CUDA).
std::string device_name(bool gpu);
std::string cuda_version();
std::string git_revision();

}  // namespace fa
