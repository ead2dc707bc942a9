// FlashAttention, step by step — harness/cli.h
// The one harness: the common command line of every stage executable, input set-up, dumps and JSON
// records (the check against the oracle and the timing live in eval.h). A stage's main hands its own
// Stage and step 1's oracle to stage_main(); nothing here knows any particular stage.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "core/stage.h"
#include "harness/eval.h"

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
  bool tuned = false;  // use step 6's tuned configuration (tuning and caching it if needed)
  bool list_variants = false;  // print the stage's variants and tuning configurations, run nothing
  std::string bench_against;   // with --bench: also time this variant, alternating with the main one
  std::map<std::string, std::string> record_extra;  // more fields for the JSON record (set by a main())
  // What --tuned asks: the configuration to run for a stage and problem. Set by a program that links step
  // 6's autotuner (the tour, through the registry); empty in a stage's own executable.
  std::function<std::string(const Stage&, const Problem&)> tuner;
};

// Adds the flags every stage accepts (--batch ... --json) to `app`.
void add_common_options(CLI::App& app, CommonOptions& o);

// Resolves defaults (input_pos = Nk - Nq, scale = 1/sqrt(d)), reads --inputs or draws random inputs,
// validates. Throws std::invalid_argument / std::runtime_error with a clear message.
Inputs prepare_inputs(CommonOptions& o);

// Runs one stage as its executable does: check (against `oracle`), bench, dump, json. Returns the process
// exit code; bad input throws std::invalid_argument / std::runtime_error.
int run_stage(const Stage& s, const Oracle& oracle, CommonOptions& o);

// main() of a stage executable with no flags of its own: parses the common flags, runs, and turns any
// error into one line on stderr and exit code 2.
int stage_main(const Stage& s, const Oracle& oracle, int argc, char** argv);

}  // namespace fa
