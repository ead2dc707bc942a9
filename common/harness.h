// FlashAttention, step by step — common/harness.h
// The one harness: the common command line of every stage executable, input set-up, dumps and JSON
// records (the check against step 1 and the timing live in eval.h).
#pragma once
#include <map>
#include <optional>
#include <string>

#include "eval.h"
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
  bool tuned = false;  // use step 6's tuned configuration (tuning and caching it if needed)
  bool list_variants = false;  // print the stage's variants and tuning configurations, run nothing
  std::string bench_against;   // with --bench: also time this variant, alternating with the main one
  std::map<std::string, std::string> record_extra;  // more fields for the JSON record (set by a main())
};

// Adds the flags every stage accepts (--batch ... --json) to `app`.
void add_common_options(CLI::App& app, CommonOptions& o);

// Resolves defaults (input_pos = Nk - Nq, scale = 1/sqrt(d)), reads --inputs or draws random inputs,
// validates. Throws std::invalid_argument / std::runtime_error with a clear message.
Inputs prepare_inputs(CommonOptions& o);

// Runs one stage as its executable does: check, bench, dump, json. Returns the process exit code.
int run_stage(const Stage& s, CommonOptions& o);

// main() of a stage executable with no flags of its own.
int stage_main(const std::string& stage_name, int argc, char** argv);

}  // namespace fa
