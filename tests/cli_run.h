// FlashAttention, step by step — tests/cli_run.h: running a stage's main() inside a test, as its executable
// would, and a fresh directory per test (the command-line tests of test_io_cli.cpp and test_refusals.cpp).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "harness/cli.h"
#include "harness/registry.h"

namespace fa::cli_test {

namespace fs = std::filesystem;

// A fresh, empty directory per test.
inline fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("fa_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// What a stage's main() returned and printed.
struct CliResult {
  int rc;
  std::string out, err;
};

// Runs `s`'s main() in-process with `args`, capturing what it prints.
inline CliResult run_main(const Stage& s, std::vector<std::string> args) {
  args.insert(args.begin(), s.name);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int rc = stage_main(s, reference_oracle(), int(argv.size()), argv.data());
  std::string out = ::testing::internal::GetCapturedStdout();
  return {rc, std::move(out), ::testing::internal::GetCapturedStderr()};
}

// The same for the stage named `name` in the registry.
inline CliResult run_stage_main(const std::string& name, std::vector<std::string> args) {
  return run_main(find_stage(name), std::move(args));
}

}  // namespace fa::cli_test
