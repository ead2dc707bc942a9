// FlashAttention, step by step — tests of the harness: .npy I/O and the command line's handling of bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "harness/cli.h"
#include "tests/cli_run.h"
#include "harness/registry.h"
#include "core/npy.h"

namespace fa {
namespace {

namespace fs = std::filesystem;
using cli_test::CliResult, cli_test::ProgramResult, cli_test::run_program, cli_test::run_stage_main, cli_test::temp_dir;

// Step 1's main() with `args`: the exit code and what it printed to stderr.
std::pair<int, std::string> run_cli(std::vector<std::string> args) {
  const CliResult r = run_stage_main("step1_cpu_reference", std::move(args));
  return {r.rc, r.err};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

TEST(Npy, RoundTripKeepsShapeAndValues) {
  const fs::path d = temp_dir("npy");
  Tensor t({2, 3, 5});
  for (size_t i = 0; i < t.size(); ++i) t.data[i] = 0.25f * float(i) - 1.0f;
  write_npy((d / "t.npy").string(), t);
  const Tensor r = read_npy((d / "t.npy").string());
  EXPECT_EQ(r.shape, t.shape);
  EXPECT_EQ(r.data, t.data);
  // The header is padded so the data starts on a 64-byte boundary, as NumPy does.
  EXPECT_EQ(fs::file_size(d / "t.npy") % 64, (t.size() * 4) % 64);
}

TEST(Npy, MalformedFilesGiveClearErrors) {
  const fs::path d = temp_dir("bad_npy");
  Tensor t({4});
  write_npy((d / "good.npy").string(), t);
  std::ifstream f(d / "good.npy", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(f)), {});

  struct Bad {
    std::string name, bytes, message;
  };
  std::string f8 = good;
  f8.replace(f8.find("<f4"), 3, "<f8");
  const std::vector<Bad> cases = {
      {"magic.npy", "PK\x03\x04 not numpy at all", "magic"},
      {"f8.npy", f8, "float32"},
      {"short.npy", good.substr(0, good.size() - 3), "fewer"},
      {"long.npy", good + "xxxx", "more data"},
      {"empty.npy", "", "magic"},
  };
  for (const Bad& b : cases) {
    write_bytes(d / b.name, b.bytes);
    try {
      read_npy((d / b.name).string());
      ADD_FAILURE() << b.name << " was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(b.name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(read_npy((d / "missing.npy").string()), std::runtime_error);
}

TEST(Cli, BadProblemsExitNonZeroWithOneMessage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--heads", "6", "--kv-heads", "4"}, "multiple of kv-heads"},
      {{"--dim", "0"}, "head dim must be positive"},
      {{"--batch", "-1"}, "batch must be positive"},
      {{"--seq", "-5"}, "sequence lengths must be positive"},
      {{"--dropout", "1"}, "--dropout: must be in [0, 1) (got 1)"},
      {{"--dropout", "-0.1"}, "--dropout: must be in [0, 1) (got -0.1)"},
      {{"--dtype", "fp8"}, "fp8"},
      {{"--variant", "nope"}, "no variant"},
      {{"--bench", "--bench-against", "nope"}, "no variant"},
      {{"--bench-against", "naive"}, "--bench-against needs --bench"},
      {{"--tuned", "--variant", "fa2"}, "--tuned or --variant, not both"},
  };
  for (const auto& [args, msg] : cases) {
    const auto [rc, err] = run_cli(args);
    EXPECT_NE(rc, 0) << args[0];
    EXPECT_NE(err.find(msg), std::string::npos) << "stderr was: " << err;
  }
}

// --tuned needs step 6's tuner; a program that does not link it (a stage's own executable) says where it is.
TEST(Cli, TunedWithoutTheTunerNamesStep6) {
  Stage s;
  s.name = "fake_stage";
  s.variants = {"default"};
  s.tuning_variants = {"default", "other"};
  s.unsupported = [](const Problem&, const std::string&) { return std::string(); };
  CommonOptions o;
  o.tuned = true;
  o.seq = 8;
  o.problem.d = 4;
  try {
    run_stage(s, reference_oracle(), o);
    FAIL() << "--tuned without a tuner must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("step6_autotune"), std::string::npos) << e.what();
  }
}

// A dropout mask too large to dump (over 2^26 bytes) is said to be left out, not reported as written.
TEST(Cli, DumpSaysWhenTheDropoutMaskIsLeftOut) {
  const fs::path d = temp_dir("bigmask");
  const auto [rc, out, err] = run_stage_main("step2_online_softmax", {"--variant", "fa2", "--heads", "1", "--seq",
                                                                      "8193", "--dim", "2", "--dropout", "0.1",
                                                                      "--dump", d.string()});
  EXPECT_EQ(rc, 0) << err;
  EXPECT_TRUE(fs::exists(d / "o.npy"));
  EXPECT_FALSE(fs::exists(d / "dropout_mask.npy"));
  EXPECT_EQ(out.find("dropout_mask}"), std::string::npos) << out;
  EXPECT_NE(out.find("dropout_mask.npy not written"), std::string::npos) << out;
}

TEST(Cli, ListVariantsPrintsAndRunsNothing) {
  const auto [rc, out, err] = run_stage_main("step2_online_softmax", {"--list-variants"});
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(out.rfind("variants (--variant NAME; the first is the default):\n  3pass\n", 0), 0u) << out;
  EXPECT_NE(out.find("  fa2\n"), std::string::npos) << out;
}

TEST(Cli, BenchAgainstRecordsBothVariantsOfOneRun) {
  const fs::path d = temp_dir("against");
  const std::string json = (d / "rec.jsonl").string();
  const CliResult r = run_stage_main("step2_online_softmax", {"--seq", "32", "--dim", "16", "--bench", "--variant",
                                                               "fa2", "--bench-against", "3pass", "--json", json});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ifstream f(json);
  const nlohmann::json rec = nlohmann::json::parse(f);
  EXPECT_EQ(rec["variant"], "fa2");
  EXPECT_GT(rec["fwd_ms"].get<double>(), 0.0);
  EXPECT_EQ(rec["against"]["variant"], "3pass");
  EXPECT_GT(rec["against"]["fwd_ms"].get<double>(), 0.0);
}

TEST(Cli, DumpWritesNumpyFilesWithTheDocumentedShapes) {
  const fs::path d = temp_dir("dump");
  const auto [rc, err] = run_cli({"--batch", "2", "--heads", "4", "--kv-heads", "2", "--seq-q", "5", "--seq-k", "7",
                                  "--dim", "8", "--causal", "--dropout", "0.2", "--backward", "--check", "--dump",
                                  d.string()});
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(read_npy((d / "o.npy").string()).shape, (std::vector<int64_t>{2, 4, 5, 8}));
  EXPECT_EQ(read_npy((d / "lse.npy").string()).shape, (std::vector<int64_t>{2, 4, 5}));
  EXPECT_EQ(read_npy((d / "dq.npy").string()).shape, (std::vector<int64_t>{2, 4, 5, 8}));
  EXPECT_EQ(read_npy((d / "dk.npy").string()).shape, (std::vector<int64_t>{2, 2, 7, 8}));
  EXPECT_EQ(read_npy((d / "dv.npy").string()).shape, (std::vector<int64_t>{2, 2, 7, 8}));
  EXPECT_TRUE(fs::exists(d / "dropout_mask.npy"));
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().extension(), ".npy") << e.path();
}

TEST(Cli, InputsRoundTripThroughDump) {
  const fs::path in = temp_dir("inputs"), out = temp_dir("inputs_out");
  Tensor q({1, 2, 3, 4}), k({1, 1, 6, 4}), v({1, 1, 6, 4});
  for (Tensor* t : {&q, &k, &v})
    for (size_t i = 0; i < t->size(); ++i) t->data[i] = 0.1f * float(i % 7) + 0.3f;
  write_npy((in / "q.npy").string(), q);
  write_npy((in / "k.npy").string(), k);
  write_npy((in / "v.npy").string(), v);
  const auto [rc, err] = run_cli({"--inputs", in.string(), "--dtype", "fp32", "--check", "--dump", out.string()});
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(read_npy((out / "o.npy").string()).shape, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(Cli, BadInputsLeaveNoFileBehind) {
  const fs::path in = temp_dir("bad_inputs"), out = temp_dir("bad_inputs_out");
  write_npy((in / "q.npy").string(), Tensor({1, 3, 4, 8}));
  write_npy((in / "k.npy").string(), Tensor({1, 2, 4, 8}));  // 3 query heads, 2 KV heads
  write_npy((in / "v.npy").string(), Tensor({1, 2, 4, 8}));
  auto [rc, err] = run_cli({"--inputs", in.string(), "--dump", out.string()});
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("not a multiple"), std::string::npos) << err;

  write_npy((in / "v.npy").string(), Tensor({1, 2, 5, 8}));  // K and V disagree
  std::tie(rc, err) = run_cli({"--inputs", in.string(), "--dump", out.string()});
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("same shape"), std::string::npos) << err;

  write_bytes(in / "v.npy", "garbage");
  std::tie(rc, err) = run_cli({"--inputs", in.string(), "--dump", out.string()});
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("v.npy"), std::string::npos) << err;

  EXPECT_TRUE(fs::is_empty(out)) << "a failed run left files in " << out;
}

TEST(Cli, DumpToAMissingDirectoryFailsCleanly) {
  const auto [rc, err] = run_cli({"--seq", "8", "--dim", "8", "--dump", "/nonexistent/dir"});
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("not an existing directory"), std::string::npos) << err;
}

TEST(AtomicFileSet, UncommittedFilesDisappear) {
  const fs::path d = temp_dir("atomic");
  {
    AtomicFileSet files;
    files.add_f32((d / "a.npy").string(), Tensor({3}));
    // destroyed without commit(), as when a later write throws
  }
  EXPECT_TRUE(fs::is_empty(d));
}

// ---- files written whole or not at all ----------------------------------------------------------------

// Every file of a directory and its bytes: what a failed write must leave as it was (and no temporary).
std::map<std::string, std::string> contents(const fs::path& d) {
  std::map<std::string, std::string> all;
  for (const auto& e : fs::directory_iterator(d)) {
    std::ifstream f(e.path(), std::ios::binary);
    all[e.path().filename().string()].assign(std::istreambuf_iterator<char>(f), {});
  }
  return all;
}

fs::path step1_executable() { return cli_test::build_dir() / "step1_cpu_reference" / "step1_cpu_reference"; }

// The problem of these tests: o.npy holds 4 KiB of data, more than a page.
const std::vector<std::string> kSmall = {"--seq", "8", "--dim", "64", "--heads", "2"};
std::vector<std::string> small_with(std::vector<std::string> extra) {
  std::vector<std::string> a = kSmall;
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(FilesWhole, JsonOnAFullDeviceIsExit2WithThePath) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "/dev/full is not there";
  const auto [rc, err] = run_cli({"--seq", "8", "--dim", "8", "--json", "/dev/full"});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--json: cannot append to /dev/full: No space left on device"), std::string::npos) << err;
}

// Writes cut short partway (a file-size limit stops them, as a full disk would; no root needed): the
// record and the dump are left byte for byte as they were, no temporary stays, and the error names the file.
TEST(FilesWhole, AWriteCutShortLeavesEveryFileAsItWas) {
  if (!fs::exists(step1_executable())) GTEST_SKIP() << step1_executable() << " is not built";
  const fs::path d = temp_dir("cut_short");
  const std::string json = (d / "rec.jsonl").string();
  const ProgramResult first = run_program(step1_executable(), small_with({"--json", json, "--dump", d.string()}));
  ASSERT_EQ(first.rc, 0) << first.err;
  const auto before = contents(d);
  // The next record straddles the limit: its first 40 bytes fit, the rest fails.
  const long json_size = long(fs::file_size(json));
  ProgramResult r = run_program(step1_executable(), small_with({"--seed", "5", "--json", json}), json_size + 40);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--json: cannot append to " + json + ": File too large; " + json + " is as it was"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(contents(d), before);
  // o.npy (4 KiB) straddles a 1 KiB limit: the dump fails, the old files stay.
  r = run_program(step1_executable(), small_with({"--seed", "5", "--dump", d.string()}), 1024);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("cannot write " + (d / "o.npy").string() + ": File too large"), std::string::npos) << r.err;
  EXPECT_EQ(contents(d), before);
  // A record to a new file that fails leaves no file.
  const std::string fresh = (temp_dir("cut_short_new") / "new.jsonl").string();
  r = run_program(step1_executable(), small_with({"--json", fresh}), 40);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("no file was created"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(fresh));
}

// A small disk filled up (a 64 KiB tmpfs; mounting one needs root, which CI has): the dump and the record
// fail with "No space left on device" and every file is as it was, the record file's last page included.
TEST(FilesWhole, AFullDiskLeavesEveryFileAsItWas) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "mounting a tmpfs needs root; FilesWhole.AWriteCutShortLeavesEveryFileAsItWas covers the same "
                    "paths with a file-size limit";
  const fs::path d = temp_dir("full_disk");
  if (::mount("tmpfs", d.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs on " << d << ": " << std::strerror(errno);
  struct Unmount {
    fs::path d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{d};
  ASSERT_EQ(run_stage_main("step1_cpu_reference", small_with({"--dump", d.string()})).rc, 0);
  // A record file of 3996 bytes: its page has 100 bytes free, so the next record is written partway.
  const std::string json = (d / "rec.jsonl").string();
  write_bytes(json, "{\"pad\": \"" + std::string(3996 - 12, 'x') + "\"}\n");
  ASSERT_EQ(fs::file_size(json), 3996u);
  {  // fill the disk
    const int fd = ::open((d / "filler").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    const std::string page(4096, 'f');
    while (::write(fd, page.data(), page.size()) > 0) {
    }
    ::close(fd);
  }
  const auto before = contents(d);
  CliResult r = run_stage_main("step1_cpu_reference", small_with({"--seed", "5", "--dump", d.string()}));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("cannot write " + (d / "o.npy").string() + ": No space left on device"), std::string::npos)
      << r.err;
  EXPECT_EQ(contents(d), before);
  r = run_stage_main("step1_cpu_reference", small_with({"--seed", "5", "--json", json}));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--json: cannot append to " + json + ": No space left on device; " + json + " is as it was"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(contents(d), before);
}

}  // namespace
}  // namespace fa
