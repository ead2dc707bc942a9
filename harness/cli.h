// FlashAttention, step by step — harness/cli.h
// The one harness: the common command line of every stage executable, input set-up, dumps and JSON
// records (the check against the oracle and the timing live in eval.h). A stage's main hands its own
// Stage and step 1's oracle to stage_main(); nothing here knows any particular stage.
//
// Bad input is refused before anything runs, with one line on stderr and exit code 2: a malformed flag,
// flags that contradict each other or that the run would ignore, non-finite values in --inputs, a problem
// that does not fit in the machine's memory. Nothing is written by a refused run.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/stage.h"
#include "harness/eval.h"

namespace CLI {
class App;
class Validator;
}

namespace fa {

struct CommonOptions {
  // The problem. prepare_inputs() resolves its shape, seed and scale from the flags below, its own defaults
  // standing in for the flags not given; --causal, --dropout and --backward set it directly.
  Problem problem;
  // Unset: the flag was not given (so that --inputs can refuse the shape flags it would ignore).
  std::optional<int64_t> batch, heads, kv_heads, seq, seq_q, seq_k, dim, input_pos;
  std::optional<uint64_t> seed;
  std::optional<float> scale;
  std::string dtype = "bf16";
  std::string variant;  // "" = the stage's default
  std::string inputs_dir, dump_dir, json_file;
  // Score modifiers (core/score_mod.h); --alibi sets the problem directly.
  std::string bias_file, window, alibi_slopes_file;  // --bias FILE, --window L,R, --alibi-slopes FILE
  std::optional<float> softcap;
  // A packed variable-length batch (core/varlen.h): --cu-seqlens-q and --cu-seqlens-k, "0,5,5,12".
  std::string cu_seqlens_q, cu_seqlens_k;
  std::string cache_seqlens;  // --cache-seqlens n0,n1,...: a KV cache of ragged sequences (Problem::cache_seqlens)
  bool varlen() const { return !cu_seqlens_q.empty() || !cu_seqlens_k.empty(); }
  bool check = false, bench = false;
  bool tuned = false;  // use step 6's tuned configuration (tuning and caching it if needed)
  bool list_variants = false;  // print the stage's variants and tuning configurations, run nothing
  std::string bench_against;   // with --bench: also time this variant, alternating with the main one
  std::map<std::string, std::string> record_extra;  // more fields for the JSON record (set by a main())
  // What --tuned asks: the configuration to run for a stage and problem. Set by a program that links step
  // 6's autotuner (the tour, through the registry); empty in a stage's own executable. It may set the
  // problem's split count (a decode's tuned --splits).
  std::function<std::string(const Stage&, Problem&)> tuner;
};

// Adds the flags every stage accepts (--batch ... --json) to `app`.
void add_common_options(CLI::App& app, CommonOptions& o);

// A check for a flag's value (option->check(whole_number(1, ...))): a whole number in [lo, hi], refused
// with a plain message ("--tile: must be at least 1 (got 0)"); "-1" is refused, not wrapped around into
// an unsigned 18446744073709551615.
CLI::Validator whole_number(uint64_t lo, uint64_t hi);

// Parses the command line into `app`. Returns std::nullopt to go on, or the exit code to stop with: 0 after
// --help (printed), 2 after a malformed command line (one line on stderr: "program: error: ...").
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program);

// The flags given on the command line ("--seq", "--check", ...), in the order the program declared them.
std::vector<std::string> flags_given(const CLI::App& app);

// Throws std::invalid_argument when a flag other than `mode` and `allowed` was given: `mode` would ignore
// it. The message says what the mode does and what to drop: "--trace <does>: drop --check, --seq".
void refuse_flags_beside(const CLI::App& app, const std::string& mode, const std::vector<std::string>& allowed,
                         const std::string& what_mode_does);

// The refusals that need to know which flags were typed, for a program using the common flags: today,
// --list-variants runs nothing, so it comes alone.
void check_command_line(const CLI::App& app, const CommonOptions& o);

// Flag combinations that cannot run, refused before any input is read or drawn: --bench-against without
// --bench, --tuned with --variant or without configurations to tune, a variant the stage does not have,
// --backward for a stage without one, a --dump directory or --json file that cannot be written.
void check_common_flags(const Stage& s, const CommonOptions& o);

// Called by prepare_inputs() once the problem is resolved and valid, before any random input is drawn, with
// the bytes the random inputs will take (0 with --inputs, whose files are read first: they set the shape).
// A program refuses there what cannot run (require_memory_for) and says how long a long run will take,
// before the inputs' memory and time are spent.
using BeforeInputs = std::function<void(const Problem& p, double input_bytes)>;

// Resolves defaults (input_pos = Nk - Nq, scale = 1/sqrt(d)), reads --inputs or draws random inputs,
// validates. Refuses shape flags beside --inputs (the files set the shape), --input-pos without --causal,
// and non-finite input values (or values the dtype rounds to infinity), naming the file and the element.
// Throws std::invalid_argument / std::runtime_error with a clear message.
Inputs prepare_inputs(CommonOptions& o, const BeforeInputs& before_inputs = {});

// Throws std::runtime_error when running `variant` of s on p (and, with `check`, the oracle's fp64
// reference), with `input_bytes` of inputs still to be made, needs more host memory than the machine has
// available, saying how much of each.
void require_memory_for(const Stage& s, const Oracle& oracle, const Problem& p, const std::string& variant,
                        bool check, double input_bytes = 0);

// For a CPU stage and a problem large enough to matter: prints one line saying about how long running each
// of `variants` of s on p will take, as o asks (--check's fp64 reference, --bench's repeated runs), when that
// is more than a few seconds. The rate is measured on a small problem of the same kind (a fraction of a
// second); a GPU stage, or a run estimated shorter, prints nothing.
void announce_long_cpu_run(const Stage& s, const Oracle& oracle, const Problem& p,
                           const std::vector<std::string>& variants, const CommonOptions& o);

// Exit code 3: a run whose outputs hold a NaN, or an infinity where none belongs (every O and gradient
// element is finite; LSE is -inf only for a row that sees no key). Distinct from 1 (--check failed) and
// 2 (bad input, a failed write).
constexpr int kExitNonFinite = 3;

// "" when the outputs of a run of p are all finite (LSE may be -inf where the row sees no key), else what is
// not: each output with its counts and first bad element ("O holds 28 NaN of 32 (the first at [0, 0, 0, 0])"),
// and the likely cause when the inputs can make one (scores beyond float32's range).
std::string nonfinite_outputs(const Problem& p, const Inputs& in, const Outputs& out);

// The --help text on exit codes (CLI11's footer), set by add_common_options().
extern const char* const kExitCodes;

// Runs one stage as its executable does: check (against `oracle`), bench, dump, json; a run with neither
// --check nor --bench prints what it computed (shapes, checksums, first values, its time). Returns the
// process exit code (0, 1 for a failed check, kExitNonFinite for NaN or infinite outputs, said on stderr);
// bad input, or a --dump or --json file that cannot be written, throws std::invalid_argument /
// std::runtime_error. The files are written whole or not at all: a --json record is one whole line or
// nothing (a failed append is truncated back), --dump's files all appear or none.
int run_stage(const Stage& s, const Oracle& oracle, CommonOptions& o);

// A packed variable-length batch (--cu-seqlens-q, --cu-seqlens-k; core/varlen.h): `variants` of s, each on
// the same random packed inputs (Q [total_q, Hq, d], K, V [total_k, Hkv, d]), run sequence by sequence
// (make_varlen_runner); --check compares with the oracle run the same way, --bench times it; a run with
// neither prints what it computed. Of several variants, those s.unsupported() refuses are left out. Refuses
// (std::invalid_argument, before anything is drawn) a stage without Stage::has_varlen, a malformed list, and
// the flags a varlen run does not take: the shape flags the lists replace (--batch, --seq, --seq-q, --seq-k),
// --input-pos (bottom-right per sequence), --bias, --dropout, --splits, --inputs, --dump, --json,
// --bench-against, --tuned. Returns the exit code as run_stage does.
int run_varlen(const Stage& s, const Oracle& oracle, CommonOptions& o, const std::vector<std::string>& variants);

// Call inside a catch (...) block: reports the exception being handled as one line on stderr,
// "program: error: ...", and returns the exit code 2. A failed allocation is said in words.
int report_error(const std::string& program);

// main() of a stage executable with no flags of its own: parses the common flags, runs, and turns any
// error into one line on stderr and exit code 2.
int stage_main(const Stage& s, const Oracle& oracle, int argc, char** argv);

}  // namespace fa
