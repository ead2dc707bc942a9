// FlashAttention, step by step — tests of the refusals: every kind of bad input a stage executable turns
// away before running anything (exit code 2, one line naming the problem, no file written), the check's
// strictness about NaN and unwritten elements, and what a run that is not refused says it did.
// Step 1's main runs in-process; step 2's own flags (--trace, --footprint, --tile, --budget and the
// all-variants table) belong to its executable, which runs as a child process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/npy.h"
#include "core/parallel.h"
#include "core/random.h"
#include "harness/cli.h"
#include "tests/cli_run.h"
#include "tests/declarations.h"
#include "harness/registry.h"
#include "step2_online_softmax/online.h"

namespace fa {
namespace {

namespace fs = std::filesystem;
using cli_test::CliResult, cli_test::ProgramResult, cli_test::run_main, cli_test::run_program, cli_test::run_stage_main,
    cli_test::temp_dir;

// Step 2's executable, built beside this test binary (build/tests/fa_tests, build/step2_online_softmax/...).
fs::path step2_executable() {
  return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "step2_online_softmax" /
         "step2_online_softmax";
}

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs step 2's executable with `args` in a child process: its exit code, stdout and stderr.
CliResult run_step2(const std::vector<std::string>& args) {
  const fs::path err_file = temp_dir("step2_stderr") / "stderr.txt";
  std::string cmd = shell_quoted(step2_executable().string());
  for (const std::string& a : args) cmd += " " + shell_quoted(a);
  cmd += " 2>" + shell_quoted(err_file.string());
  CliResult r{-1, "", ""};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

#define REQUIRE_STEP2_EXECUTABLE()                                                              \
  if (!fs::exists(step2_executable())) GTEST_SKIP() << step2_executable() << " is not built"

// A refusal: exit code 2 and the message on stderr as one line; by default, before anything ran, so with
// nothing on stdout.
void expect_refused(const CliResult& r, const std::string& message, const std::string& what,
                    bool before_the_run = true) {
  EXPECT_EQ(r.rc, 2) << what << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << what << "\nstderr was: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << "\nstderr: " << r.err;
  if (before_the_run) {
    EXPECT_EQ(r.out, "") << what;
  }
}

struct Refusal {
  std::vector<std::string> args;
  std::string message;
};

// Each refusal also asks for a dump and a JSON record, and must leave neither behind.
void expect_refused_without_files(const std::string& stage, const std::vector<Refusal>& cases) {
  const fs::path dump = temp_dir("dump"), json_dir = temp_dir("json");
  for (const Refusal& c : cases) {
    std::vector<std::string> args = c.args;
    for (const std::string& a : {std::string("--dump"), dump.string(), std::string("--json"),
                                 (json_dir / "rec.jsonl").string()})
      args.push_back(a);
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    expect_refused(run_stage_main(stage, args), c.message, what);
  }
  EXPECT_TRUE(fs::is_empty(dump)) << "a refused run left files in " << dump;
  EXPECT_TRUE(fs::is_empty(json_dir)) << "a refused run left a JSON record in " << json_dir;
}

// ---- flags ------------------------------------------------------------------------------------------

TEST(Refusals, MalformedFlagValues) {
  expect_refused_without_files(
      "step1_cpu_reference",
      {
          {{"--seed", "-1"}, "--seed: must be a whole number from 0 to 18446744073709551615 (got -1)"},
          {{"--seed", "18446744073709551616"}, "--seed: must be a whole number from 0 to 18446744073709551615"},
          {{"--seed", "12abc"}, "--seed: must be a whole number"},
          {{"--scale", "inf"}, "scale must be a positive finite number (got inf)"},
          {{"--scale", "nan"}, "scale must be a positive finite number"},
          {{"--scale", "0"}, "scale must be a positive finite number (got 0)"},
          {{"--scale", "-0.5"}, "scale must be a positive finite number (got -0.5)"},
          {{"--seq", "abc"}, "Could not convert: --seq = abc"},
          {{"--dtype", "fp8"}, "--dtype: fp8 not in {bf16,fp16,fp32}"},
          {{"--no-such-flag"}, "--no-such-flag"},
          // The value typed, not the float it became: 0.999999999 is float32's 1.
          {{"--dropout", "0.999999999"}, "--dropout: must be in [0, 1): 0.999999999 rounds to 1 in float32 (the "
                                         "largest usable value is 0.99999994)"},
          {{"--dropout", "1"}, "--dropout: must be in [0, 1) (got 1)"},
          {{"--dropout", "nan"}, "--dropout: must be in [0, 1) (got nan)"},
      });
  // The largest float below 1 runs, and the run shows it as it is.
  const CliResult r = run_stage_main("step1_cpu_reference", {"--seq", "8", "--dim", "4", "--dropout", "0.99999994"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("dropout=0.99999994 "), std::string::npos) << r.out;
}

TEST(Refusals, FlagsTheRunWouldIgnore) {
  expect_refused_without_files(
      "step1_cpu_reference",
      {
          {{"--seq", "8", "--input-pos", "2"}, "--input-pos places the causal mask (and the window and ALiBi's diagonal): "
                                                "add --causal, or drop --input-pos"},
          {{"--seq", "8", "--seq-q", "4", "--seq-k", "6"}, "beside both, it sets nothing; drop --seq"},
          {{"--seq", "8", "--bench-against", "x"}, "--bench-against needs --bench"},
          {{"--list-variants", "--seq", "5"}, "--list-variants prints the stage's names and runs nothing: drop --seq"},
          {{"--seq", "8", "--variant", "nope"}, "step1_cpu_reference has no variant 'nope'"},
          {{"--seq", "8", "--splits", "2"}, "step1_cpu_reference has no split-KV path (--splits)"},
          {{"--seq", "8", "--splits", "-1"}, "splits must be in 0 .. 1024"},
      });
}

// --list-variants runs nothing, so nothing else may come with it; alone it answers.
TEST(Refusals, ListVariantsComesAlone) {
  const CliResult r = run_stage_main("step2_online_softmax", {"--list-variants", "--check"});
  expect_refused(r, "--list-variants prints the stage's names and runs nothing: drop --check", "--check");
  EXPECT_EQ(run_stage_main("step2_online_softmax", {"--list-variants"}).rc, 0);
}

TEST(Refusals, UnwritableOutputsAreRefusedBeforeTheRun) {
  const fs::path d = temp_dir("unwritable");
  CliResult r = run_stage_main("step1_cpu_reference", {"--seq", "8", "--json", "/nonexistent/dir/rec.jsonl"});
  expect_refused(r, "--json: the directory /nonexistent/dir of /nonexistent/dir/rec.jsonl does not exist", "--json");
  r = run_stage_main("step1_cpu_reference", {"--seq", "8", "--json", d.string()});
  expect_refused(r, "is a directory, not a file", "--json DIR");
  r = run_stage_main("step1_cpu_reference", {"--seq", "8", "--dump", (d / "missing").string()});
  expect_refused(r, "is not an existing directory", "--dump");
  EXPECT_TRUE(fs::is_empty(d));
}

// ---- --inputs -----------------------------------------------------------------------------------

// q [1, 4, 20, 8], k and v [1, 2, 9, 8], dO like q: finite values unless a test plants one.
struct InputFiles {
  Tensor q{{1, 4, 20, 8}, 0.5f}, k{{1, 2, 9, 8}, 0.25f}, v{{1, 2, 9, 8}, 1.0f}, dout{{1, 4, 20, 8}, 0.1f};
  void write(const fs::path& dir) const {
    write_npy((dir / "q.npy").string(), q);
    write_npy((dir / "k.npy").string(), k);
    write_npy((dir / "v.npy").string(), v);
    write_npy((dir / "do.npy").string(), dout);
  }
};

// The flat index of element [b, h, i, c] of a [B, H, N, d] tensor.
size_t at(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t c) {
  return size_t(((b * t.shape[1] + h) * t.shape[2] + i) * t.shape[3] + c);
}

TEST(Refusals, NonFiniteInputsNameTheFileAndTheElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    float value;
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"q", nan, {}, "q.npy: element [0, 3, 17, 5] is NaN"},
      {"k", inf, {}, "k.npy: element [0, 1, 7, 2] is inf"},
      {"v", -inf, {}, "v.npy: element [0, 1, 7, 2] is -inf"},
      {"do", nan, {"--backward"}, "do.npy: element [0, 3, 17, 5] is NaN"},
      {"v", 70000.0f, {"--dtype", "fp16"}, "v.npy: element [0, 1, 7, 2] = 70000 is beyond fp16's range"},
  };
  for (const Case& c : cases) {
    const fs::path in = temp_dir("nonfinite");
    InputFiles files;
    Tensor& t = std::string(c.name) == "q" ? files.q : std::string(c.name) == "k" ? files.k
                : std::string(c.name) == "v" ? files.v : files.dout;
    t.data[t.shape[1] == 4 ? at(t, 0, 3, 17, 5) : at(t, 0, 1, 7, 2)] = c.value;
    files.write(in);
    std::vector<std::string> args = {"--inputs", in.string()};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    expect_refused_without_files("step1_cpu_reference", {{args, c.message}});
  }
}

TEST(Refusals, ShapeFlagsBesideInputs) {
  const fs::path in = temp_dir("shape_flags");
  InputFiles().write(in);
  expect_refused_without_files(
      "step1_cpu_reference",
      {
          {{"--inputs", in.string(), "--seq", "5", "--heads", "2"},
           "the shape comes from the files in --inputs: drop --heads, --seq"},
          {{"--inputs", in.string(), "--dim", "4"}, "the shape comes from the files in --inputs: drop --dim"},
          {{"--inputs", in.string(), "--seed", "3"}, "with --inputs and no --dropout it has nothing to seed"},
      });
  // The same files with nothing beside them run.
  EXPECT_EQ(run_stage_main("step1_cpu_reference", {"--inputs", in.string()}).rc, 0);
}

// ---- score modifiers (--bias, --alibi, --window, --softcap) -------------------------------------------

// Stages with has_score_mods take them (steps 1 and 2, every variant of step 2): step 2 runs them and its
// --check passes; its backward still refuses the untiled variants, modifiers or not.
TEST(Refusals, ScoreModifiersOnStep2) {
  const fs::path d = temp_dir("mods_bias");
  write_npy((d / "bias.npy").string(), Tensor({1, 1, 8, 8}));
  for (const std::string v : {"3pass", "2pass", "online", "fa1", "fa2"})
    EXPECT_EQ(run_stage_main("step2_online_softmax", {"--seq", "8", "--variant", v, "--window", "2,1", "--alibi",
                                                      "--softcap", "30", "--bias", (d / "bias.npy").string(), "--check"})
                  .rc,
              0)
        << v;
  EXPECT_EQ(run_stage_main("step2_online_softmax", {"--seq", "8", "--variant", "fa2", "--causal", "--window", "2,0", "--bias",
                                                    (d / "bias.npy").string(), "--backward", "--check"})
                .rc,
            0);
  expect_refused_without_files(
      "step2_online_softmax",
      {
          {{"--seq", "8", "--variant", "3pass", "--window", "2,0", "--backward"},
           "--backward needs --variant fa1 or fa2, not 3pass"},
      });
}

// A stage that does not declare has_score_mods (step 7; steps 1 to 6 do) refuses the four flags, named as
// given, before anything runs, and says which stages have them.
TEST(Refusals, ScoreModifiersOnAStageWithoutThem) {
  bool made = false;
  Stage s;
  s.name = "plain_stage";
  s.unsupported = [](const Problem&, const std::string&) { return std::string(); };
  s.make = [&made](const Problem&, const Inputs&, const std::string&) -> std::unique_ptr<Runner> {
    made = true;
    throw std::runtime_error("reached make()");
  };
  expect_refused(run_main(s, {"--seq", "8", "--softcap", "5", "--window", "2,0"}),
                 "plain_stage has no score modifiers (--window, --softcap): steps 1 to 6 have them (step 4 in "
                 "its 4e and 4f configurations)",
                 "--softcap --window");
  expect_refused(run_main(s, {"--seq", "8", "--alibi"}), "plain_stage has no score modifiers (--alibi): ", "--alibi");
  EXPECT_FALSE(made) << "a refused run reached make()";
  s.has_score_mods = true;  // the same stage declaring them takes them
  const CliResult r = run_main(s, {"--seq", "8", "--alibi"});
  EXPECT_TRUE(made) << r.err;
  EXPECT_EQ(r.err.find("has no score modifiers"), std::string::npos) << r.err;
}

TEST(Refusals, MalformedScoreModifiers) {
  const fs::path d = temp_dir("mods_bad");
  write_npy((d / "wrong.npy").string(), Tensor({1, 2, 8, 7}));      // Nk 7, not 8
  write_npy((d / "heads.npy").string(), Tensor({1, 3, 8, 8}));      // 3 heads: neither 4 nor 1
  write_npy((d / "three.npy").string(), Tensor({2, 8, 8}));         // three dimensions
  write_npy((d / "slopes3.npy").string(), Tensor({3}, 0.5f));        // 3 slopes for 4 heads
  Tensor nan({1, 1, 8, 8});
  nan.data[9] = std::numeric_limits<float>::quiet_NaN();
  write_npy((d / "nan.npy").string(), nan);
  const std::vector<std::string> shape = {"--seq", "8", "--heads", "4", "--batch", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = shape;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_refused_without_files(
      "step1_cpu_reference",
      {
          {with({"--bias", (d / "wrong.npy").string()}),
           "wrong.npy has shape [1, 2, 8, 7]; this problem needs [2 or 1, 4 or 1, 8, 8]"},
          {with({"--bias", (d / "heads.npy").string()}), "heads.npy has shape [1, 3, 8, 8]; this problem needs"},
          {with({"--bias", (d / "three.npy").string()}), "three.npy has shape [2, 8, 8]; this problem needs"},
          {with({"--bias", (d / "nan.npy").string()}), "nan.npy: element [0, 0, 1, 1] is NaN; a bias must be finite or -inf"},
          {with({"--bias", (d / "missing.npy").string()}), "missing.npy"},
          {with({"--window", "3"}), "--window: expected L,R, two whole numbers (-1: unbounded), got '3'"},
          {with({"--window", "a,1"}), "--window: expected L,R"},
          {with({"--window", "-2,0"}), "window sides must be -1 (unbounded) or a number of keys >= 0 (got -2,0)"},
          {with({"--alibi-slopes", (d / "slopes3.npy").string()}), "--alibi-slopes gives ALiBi's slopes: add --alibi"},
          {with({"--alibi", "--alibi-slopes", (d / "slopes3.npy").string()}),
           "slopes3.npy has shape [3]; this problem needs [4] (one slope per query head)"},
          {with({"--softcap", "0"}), "--softcap: the cap must be a positive finite number (got 0); for no cap, drop "
                                     "--softcap"},
          {with({"--softcap", "-3"}), "--softcap: the cap must be a positive finite number (got -3); for no cap, drop "
                                      "--softcap"},
          {with({"--softcap", "inf"}), "--softcap: the cap must be a positive finite number (got inf)"},
      });
  // A dimension that is already 1 cannot broadcast: it reads "1", not "1 or 1".
  expect_refused_without_files(
      "step1_cpu_reference",
      {
          {{"--seq", "8", "--heads", "4", "--bias", (d / "wrong.npy").string()},
           "wrong.npy has shape [1, 2, 8, 7]; this problem needs [1, 4 or 1, 8, 8]"},
          {{"--seq", "8", "--heads", "1", "--bias", (d / "wrong.npy").string()},
           "wrong.npy has shape [1, 2, 8, 7]; this problem needs [1, 1, 8, 8]"},
      });
}

// What is not refused runs: every modifier at once on step 1, with a backward, dumps dbias.npy of the
// bias's shape; --input-pos places a window without --causal.
TEST(Refusals, ScoreModifiersRunOnStep1AndDumpDBias) {
  const fs::path d = temp_dir("mods_run"), out = temp_dir("mods_dump");
  write_npy((d / "bias.npy").string(), Tensor({1, 2, 8, 8}, 0.25f));
  const CliResult r = run_stage_main(
      "step1_cpu_reference", {"--seq", "8", "--heads", "2", "--batch", "2", "--dim", "16", "--bias",
                              (d / "bias.npy").string(), "--alibi", "--window", "3,1", "--softcap", "5",
                              "--input-pos", "1", "--backward", "--check", "--dump", out.string()});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("window=3,1 input_pos=1 +bias +alibi softcap=5"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out / "dbias.npy")) << r.out;
  EXPECT_EQ(read_npy((out / "dbias.npy").string()).shape, (std::vector<int64_t>{1, 2, 8, 8}));
}

// A header that promises more data than the file holds is refused before its size is allocated.
TEST(Refusals, NpyHeaderPromisingTooMuchIsRefusedBeforeAllocating) {
  const fs::path d = temp_dir("huge_header");
  write_npy((d / "t.npy").string(), Tensor({4}));
  std::ifstream f(d / "t.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  bytes.replace(bytes.find("(4,)"), 4, "(4000000000000,)");
  std::ofstream(d / "t.npy", std::ios::binary) << bytes;
  try {
    read_npy((d / "t.npy").string());
    FAIL() << "a header promising 4e12 floats was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than its shape"), std::string::npos) << e.what();
  }
}

// ---- memory and exceptions ------------------------------------------------------------------------

// Step 1 holds four [Nq, Nk] matrices per head: at Nq = Nk = 2e6 that is 64 TB, refused with the sizes.
TEST(Refusals, ProblemsBeyondTheMachinesMemory) {
  const std::vector<std::string> huge = {"--seq", "2000000", "--heads", "1", "--dim", "1"};
  expect_refused_without_files("step1_cpu_reference", {{huge, "not enough memory for step1_cpu_reference on this "
                                                               "problem (the inputs "}});
  const std::vector<std::string> checked = {"--seq", "200000", "--heads", "1", "--dim", "1", "--check"};
  expect_refused_without_files("step1_cpu_reference", {{checked, "step 1's fp64 reference"}});
  expect_refused_without_files("step2_online_softmax",
                               {{{"--variant", "3pass", "--seq", "2000000", "--heads", "1", "--dim", "1"},
                                 "not enough memory for step2_online_softmax --variant 3pass"}});
}

// Refused before the inputs are drawn: step 2's every-variant table on --seq 200000 needs 1.1 GiB of inputs
// and 3pass far more than any machine; the refusal comes with the inputs counted and none of them made.
TEST(Refusals, MemoryIsRefusedBeforeTheInputsAreMade) {
  REQUIRE_STEP2_EXECUTABLE();
  const ProgramResult r = run_program(step2_executable(), {"--seq", "200000"});
  expect_refused(r, "not enough memory for step2_online_softmax --variant 3pass on this problem (the inputs 1.1 GiB, "
                    "the run ", "--seq 200000");
  EXPECT_LT(r.max_rss_kib, 256 * 1024) << "the refused run drew its inputs first";
}

// Any exception out of a run becomes one line and exit code 2, a failed allocation in words.
TEST(Refusals, ExceptionsFromARunBecomeOneLine) {
  Stage s;
  s.name = "fake_stage";
  s.unsupported = [](const Problem&, const std::string&) { return std::string(); };
  s.make = [](const Problem&, const Inputs&, const std::string&) -> std::unique_ptr<Runner> {
    throw std::bad_alloc();
  };
  expect_refused(run_main(s, {"--seq", "8"}), "fake_stage: error: out of memory", "bad_alloc", false);
  s.make = [](const Problem&, const Inputs&, const std::string&) -> std::unique_ptr<Runner> { throw 42; };
  expect_refused(run_main(s, {"--seq", "8"}), "fake_stage: error: an exception of unknown type", "throw 42", false);
}

// An exception inside the OpenMP loop reaches the caller (it would otherwise end the program).
TEST(Refusals, ParallelLoopRethrowsTheFirstException) {
  std::atomic<int> ran{0};
  const auto body = [&](int64_t i, int64_t j) {
    if (i == 2 && j == 3) throw std::bad_alloc();
    ++ran;
  };
  EXPECT_THROW(parallel_for_2d(4, 5, body), std::bad_alloc);
  EXPECT_LT(ran.load(), 20);
}

// ---- step 2's own flags ---------------------------------------------------------------------------

TEST(Refusals, Step2FlagsItsModesWouldIgnore) {
  REQUIRE_STEP2_EXECUTABLE();
  const fs::path d = temp_dir("step2_files");
  const std::string json = (d / "rec.jsonl").string();
  const std::vector<Refusal> cases = {
      {{"--tile", "0"}, "--tile: must be at least 1 (got 0)"},
      {{"--tile", "-3"}, "--tile: must be a whole number from 1 to"},
      {{"--budget", "0"}, "--budget: must be at least 1 (got 0)"},
      {{"--trace", "--seq", "4", "--check", "--bench"}, "changed only by --seed: drop --seq, --check, --bench"},
      {{"--trace", "--dim", "3"}, "drop --dim"},
      {{"--trace", "--footprint"}, "drop --footprint"},
      {{"--trace", "--variant", "online"}, "--trace walks the loop order of fa2 (FlashAttention-2) or fa1 "
                                           "(FlashAttention-1): --variant online has none"},
      {{"--trace", "--backward", "--variant", "fa1"}, "--trace --backward walks fa2's backward (kv-outer) only: "
                                                      "drop --variant fa1"},
      {{"--trace", "--variant", "fa1", "--dropout", "0.5"}, "changed only by --seed: drop --dropout"},
      {{"--footprint", "--heads", "2", "--check"}, "--footprint prints a memory table of --seq, --seq-q, --seq-k, "
                                                   "--dim, --tile and --budget: drop --heads, --check"},
      {{"--seq", "16", "--dim", "4", "--bench-against", "3pass"}, "--bench-against needs --bench"},
      {{"--seq", "16", "--dim", "4", "--bench", "--bench-against", "3pass"},
       "--bench-against times one variant against another: add --variant"},
      {{"--seq", "16", "--dim", "4", "--tuned"}, "step2_online_softmax has no configurations to tune (--tuned)"},
      {{"--seq", "16", "--dim", "4", "--backward", "--variant", "online"}, "--backward needs --variant fa1 or fa2, not online"},
      {{"--seq", "16", "--dim", "4", "--json", json}, "--dump and --json record one variant: add --variant"},
      {{"--variant", "3pass", "--tile", "9", "--json", json, "--dump", d.string()},
       "--tile sets the tiles of 2pass and online; --variant 3pass does not use it"},
      {{"--variant", "online", "--budget", "99", "--json", json, "--dump", d.string()},
       "--budget sets the blocks of fa1 and fa2; --variant online does not use it"},
      {{"--seq", "16", "--dim", "4", "--seed", "-1"}, "--seed: must be a whole number"},
      {{"--list-variants", "--tile", "4"}, "runs nothing: drop --tile"},
  };
  for (const Refusal& c : cases) {
    std::string what;
    for (const std::string& a : c.args) what += a + " ";
    expect_refused(run_step2(c.args), c.message, what);
  }
  EXPECT_TRUE(fs::is_empty(d)) << "a refused run left files in " << d;
}

// Two decimals hide a small ratio ("0.00x"): below 0.1 the table gives two significant digits.
TEST(Refusals, Step2FootprintShowsSmallRatios) {
  REQUIRE_STEP2_EXECUTABLE();
  const CliResult r = run_step2({"--footprint", "--seq", "16384", "--tile", "64"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("0.004x of 3pass"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0.00x"), std::string::npos) << r.out;
}

// ---- the check: NaN, unwritten and non-finite references never pass ---------------------------------

TEST(CheckStrictness, PoisonAndComputedNaNAreCountedApart) {
  const float poison_fp32 = f32_from_bits(0xffffffffu);
  const float poison_bf16 = bf16_bits_to_float(0xffff), poison_fp16 = fp16_bits_to_float(0xffff);
  const float computed_nan = std::numeric_limits<float>::quiet_NaN();
  for (float p : {poison_fp32, poison_bf16, poison_fp16}) EXPECT_TRUE(is_poison(p));
  for (float x : {computed_nan, -computed_nan, f32_from_bits(0x7fffffffu), round_to(DType::bf16, computed_nan),
                  round_to(DType::fp16, -computed_nan), 1.0f})
    EXPECT_FALSE(is_poison(x)) << x;

  Tensor got({6}, 1.0f);
  got.data[0] = poison_fp32, got.data[1] = poison_bf16, got.data[2] = computed_nan;
  const Tensor ref({6}, 1.0f);
  const ErrorStats e = compare(got, ref);
  EXPECT_EQ(e.unwritten, 2u);
  EXPECT_EQ(e.nan, 1u);
  EXPECT_EQ(e.ref_nan, 0u);
  EXPECT_FALSE(tolerance_rule(e, compare(ref, ref)).pass);
}

TEST(CheckStrictness, ANonFiniteReferenceNeverPasses) {
  Tensor ref({4}, 1.0f);
  ref.data[3] = std::numeric_limits<float>::quiet_NaN();
  const Tensor got({4}, 1.0f);
  const ErrorStats e = compare(got, ref);
  EXPECT_EQ(e.ref_nan, 1u);
  EXPECT_EQ(e.max_abs, 0.0);
  EXPECT_FALSE(tolerance_rule(e, e).pass);
}

// Past the CLI (which refuses such inputs), a NaN input gives step 2 a row of O = 0 and LSE = -inf while
// the reference is NaN there: the check must fail, not call it a pass with rel_l2 = nan.
TEST(CheckStrictness, Step2OnANaNInputFailsTheCheck) {
  Problem p;
  p.B = 1, p.Hq = p.Hkv = 1, p.Nq = 4, p.Nk = 6, p.d = 4, p.dtype = DType::fp32;
  p.validate();
  Inputs in = random_inputs(p);
  in.q.data[5] = std::numeric_limits<float>::quiet_NaN();  // row 1
  for (const std::string& v : step2::stage().variants) {
    const CheckReport r = check_against_reference(p, in, step2::attention(p, in, v, step2::Config{}));
    EXPECT_FALSE(r.pass) << v;
    EXPECT_FALSE(r.verdict[0].pass) << v << ": O passed";
    EXPECT_GT(r.stage[0].ref_nan + r.stage[0].nan, 0u) << v;
  }
}

// ---- what a run says --------------------------------------------------------------------------------

TEST(RunReport, ABareRunSaysWhatItComputed) {
  const CliResult r = run_stage_main("step1_cpu_reference", {"--seq", "16", "--dim", "8", "--heads", "2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("O    [1, 2, 16, 8]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LSE  [1, 2, 16]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" sum "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one run, not warmed up:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("add --check to compare with step 1 in fp64, --bench to time"), std::string::npos) << r.out;
  // With --check the report says what the check found instead.
  const CliResult checked = run_stage_main("step1_cpu_reference", {"--seq", "16", "--dim", "8", "--check"});
  EXPECT_EQ(checked.out.find("add --check"), std::string::npos) << checked.out;
}

TEST(RunReport, ListVariantsLabelsItsTwoGroups) {
  const CliResult r = run_stage_main("step2_online_softmax", {"--list-variants"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("variants (--variant NAME; the first is the default):\n  3pass\n", 0), 0u) << r.out;
  // A stage with configurations lists them under their own label.
  Stage s;
  s.name = "fake_stage";
  s.variants = {"a"};
  s.tuning_variants = {"cfg1", "cfg2"};
  const CliResult both = run_main(s, {"--list-variants"});
  EXPECT_EQ(both.out,
            "variants (--variant NAME; the first is the default):\n  a\n"
            "configurations (--variant NAME; step 6 tunes over them):\n  cfg1\n  cfg2\n");
}

// Every stage of this build (steps 1 and 2 in a CPU-only build, every GPU stage with CUDA: no GPU needed)
// declares exactly what its unsupported() accepts (core/stage.h, Supports), in each variant and each
// configuration compiled for the head dim, on the product of the features a declaration speaks of: dtype,
// head dim, dropout, each score modifier, --splits, the backward, causal, a decode shape and a square one.
// A feature the stage does not take at all (has_splits, has_backward) is refused by the command line before
// the stage is asked: left out. The GPU grids list their cases from the declarations, so a stage that
// refused a declared case would fail there; here it fails without a GPU.
TEST(Declarations, EveryStageDeclaresExactlyWhatItRuns) {
  int checked = 0;
  for (const Stage& s : stages())
    for (DType t : {DType::fp32, DType::fp16, DType::bf16})
      for (int64_t d : {64, 96, 128})  // 96: the GPU stages run it padded to 128 (core/padded_head_dim.h)
        for (int mods = 0; mods < 5; ++mods)
          for (int bits = 0; bits < 16; ++bits) {
            Problem p;
            p.B = 1, p.Hq = 4, p.Hkv = 2, p.d = d, p.dtype = t;
            p.Nq = bits & 1 ? 1 : 128;
            p.Nk = bits & 1 ? 300 : 128;
            p.causal = (bits & 2) != 0;
            p.input_pos = p.Nk - p.Nq;
            p.scale = 1.0f / std::sqrt(float(d));
            p.dropout = bits & 4 ? 0.1f : 0.0f;
            p.backward = (bits & 8) != 0;
            p.bias = mods == 1;
            p.alibi = mods == 2;
            p.softcap = mods == 3 ? 30.0f : 0.0f;
            p.window_left = mods == 4 ? 16 : -1;
            for (int64_t splits : {0, 3}) {
              p.splits = splits;
              p.validate();
              checked += expect_stage_declares_what_it_runs(s, p);  // tests/declarations.h
            }
          }
  EXPECT_GT(checked, 0);
}

// Step 2 declares its backward in the two loop orders that have one (fa1, fa2), and every storage type.
TEST(Declarations, Step2DeclaresItsBackwardInFa1AndFa2) {
  const Stage& s = find_stage("step2_online_softmax");
  Problem p;
  p.backward = true;
  for (const std::string& v : s.variants)
    EXPECT_EQ(declares(s, p, v), v == "fa1" || v == "fa2") << v;
  p.backward = false;
  p.dtype = DType::fp32;
  for (const std::string& v : s.variants) EXPECT_TRUE(declares(s, p, v)) << v;
}

TEST(RunReport, HelpSaysTheExitCodes) {
  const CliResult r = run_stage_main("step1_cpu_reference", {"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("Exit codes: 0 done; 1 --check found an output outside the tolerance; 2 bad input or a file "
                       "that could not be written"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("3 an output is NaN or infinite"), std::string::npos) << r.out;
}

// Scores beyond float32 (q and k at 1e20: every value in range, q.k = 8e40 not) make NaN: never a quiet
// success. One line on stderr, exit code 3, with or without --check; the record (still written) says so.
TEST(RunReport, NonFiniteOutputsAreExit3) {
  const fs::path in = temp_dir("overflow"), out = temp_dir("overflow_out");
  InputFiles files;
  for (Tensor* t : {&files.q, &files.k})
    for (float& x : t->data) x = 1e20f;
  files.write(in);
  const std::string json = (out / "rec.jsonl").string();
  const std::string said = "step1_cpu_reference: error: the outputs are not finite: O holds ";
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, {"--check"}, {"--backward"}}) {
    std::vector<std::string> args = {"--inputs", in.string(), "--dtype", "fp32", "--json", json};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_stage_main("step1_cpu_reference", args);
    const std::string what = extra.empty() ? "plain" : extra[0];
    EXPECT_EQ(r.rc, kExitNonFinite) << what << "\n" << r.err;
    EXPECT_EQ(r.err.rfind(said, 0), 0u) << what << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("|scale * q.k| can reach 2.8e+40 here, beyond float32's 3.4e+38"), std::string::npos) << r.err;
    if (what == "--backward") {
      EXPECT_NE(r.err.find("dQ holds "), std::string::npos) << r.err;
    }
  }
  std::ifstream f(json);
  const std::string records((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(std::count(records.begin(), records.end(), '\n'), 3) << records;
  EXPECT_NE(records.find("\"nonfinite\":true"), std::string::npos) << records;
  if (fs::exists(step2_executable())) {  // step 2's table of every variant, which checks nothing by default
    const CliResult r = run_step2({"--inputs", in.string(), "--dtype", "fp32"});
    EXPECT_EQ(r.rc, kExitNonFinite) << r.err;
    EXPECT_NE(r.err.find("step2_online_softmax: error: the outputs of 3pass, 2pass, online, fa1, fa2 are not finite; "
                         "3pass: O holds "),
              std::string::npos)
        << r.err;
  }
}

// LSE = -inf for a row that sees no key is the convention, not a failure: rows before the first key of a
// causal run, and a row a -inf bias masks whole (backward too).
TEST(RunReport, RowsThatSeeNoKeyAreNotNonFinite) {
  CliResult r = run_stage_main("step1_cpu_reference",
                               {"--seq-q", "8", "--seq-k", "4", "--dim", "4", "--causal", "--input-pos", "-2"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("-inf"), std::string::npos) << r.out;
  const fs::path d = temp_dir("masked_row");
  Tensor bias({1, 1, 8, 8});
  for (int64_t j = 0; j < 8; ++j) bias.data[size_t(3 * 8 + j)] = -std::numeric_limits<float>::infinity();
  write_npy((d / "bias.npy").string(), bias);
  r = run_stage_main("step1_cpu_reference", {"--seq", "8", "--heads", "2", "--dim", "4", "--bias",
                                             (d / "bias.npy").string(), "--backward"});
  EXPECT_EQ(r.rc, 0) << r.err;
}

// A stage that sleeps 10 ms a run, whatever the problem: the estimate scales the small problem's time by the
// work (--seq 16384 is 2048 times Nq 256 x Nk 1024 with 4 heads: about 20 s).
struct SleepyRunner : Runner {
  Problem p;
  explicit SleepyRunner(const Problem& p) : p(p) {}
  void run() override { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }
  Outputs outputs() override {
    Outputs o;
    o.o = Tensor({p.B, p.Hq, p.Nq, p.d});
    o.lse = Tensor({p.B, p.Hq, p.Nq});
    return o;
  }
};

TEST(RunReport, ALongCpuRunSaysHowLongFirst) {
  Stage s;
  s.name = "sleepy_stage";
  s.unsupported = [](const Problem&, const std::string&) { return std::string(); };
  s.make = [](const Problem& p, const Inputs&, const std::string&) -> std::unique_ptr<Runner> {
    return std::make_unique<SleepyRunner>(p);
  };
  const CliResult r = run_main(s, {"--seq", "16384", "--dim", "4"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("sleepy_stage: this will take about ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" on this CPU (the run "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("measured on Nq 256 x Nk 1024 of the same kind); Ctrl-C stops it\nsleepy_stage: B=1"),
            std::string::npos)
      << r.out;
  // A small problem is not measured, and says nothing of time before it runs.
  const CliResult small = run_main(s, {"--seq", "64", "--dim", "4"});
  EXPECT_EQ(small.out.rfind("sleepy_stage: B=1", 0), 0u) << small.out;
}

// ---- the tour ----------------------------------------------------------------------------------------

fs::path tour_executable() { return cli_test::build_dir() / "flashattention_tour"; }

// Its --help lists what it takes: none of a stage executable's own flags, which it refuses with the reason.
TEST(Tour, HelpListsOnlyTheFlagsItTakes) {
  if (!fs::exists(tour_executable())) GTEST_SKIP() << tour_executable() << " is not built";
  const ProgramResult help = run_program(tour_executable(), {"--help"});
  EXPECT_EQ(help.rc, 0) << help.err;
  for (const std::string flag : {"--variant", "--check", "--bench", "--bench-against", "--dump", "--json",
                                 "--list-variants"}) {
    EXPECT_EQ(help.out.find("\n  " + flag + " "), std::string::npos) << flag << " is in --help:\n" << help.out;
    std::vector<std::string> args = {flag};
    if (flag != "--check" && flag != "--bench" && flag != "--list-variants") args.push_back("x");
    expect_refused(run_program(tour_executable(), args),
                   flag + " is a flag of a stage's own executable (the tour runs every stage and variant, checked "
                          "against step 1 and timed once): drop " + flag,
                   flag);
  }
  for (const std::string flag : {"--seq", "--backward", "--tuned", "--gpu-status"})
    EXPECT_NE(help.out.find("\n  " + flag + " "), std::string::npos) << flag << " is not in --help:\n" << help.out;
  EXPECT_NE(help.out.find("Exit codes: 0 every stage that ran passed its check"), std::string::npos) << help.out;
}

// Under --backward, a variant without one is skipped naming the rows that run it, not a --variant the tour
// would refuse.
// The tour checks every row against step 1: a problem whose fp64 reference cannot fit is refused before the
// inputs are drawn (exit 2, one line), not after spending their memory.
TEST(Tour, MemoryIsRefusedBeforeTheInputsAreMade) {
  if (!fs::exists(tour_executable())) GTEST_SKIP() << tour_executable() << " is not built";
  const ProgramResult r = run_program(tour_executable(), {"--seq", "200000"});
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("not enough memory for any row of the tour (the inputs 1.1 GiB, step 1's fp64 reference "),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.max_rss_kib, 256 * 1024) << "the refused tour drew its inputs first";
}

TEST(Tour, BackwardSkipsNameTheRowsThatRunIt) {
  if (!fs::exists(tour_executable())) GTEST_SKIP() << tour_executable() << " is not built";
  const ProgramResult r = run_program(tour_executable(), {"--backward", "--seq", "16", "--dim", "8", "--heads", "1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const std::string v : {"3pass", "2pass", "online"})
    EXPECT_NE(r.out.find(v + std::string(32 - v.size(), ' ') + " skipped: no backward pass in this variant (the rows "
                         "of fa1, fa2 run it)\n"),
              std::string::npos)
        << r.out;
  EXPECT_EQ(r.out.find("--variant"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fa
