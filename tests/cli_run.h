// FlashAttention, step by step — tests/cli_run.h: running a stage's main() inside a test, as its executable
// would, or an executable of this build in a child process, and a fresh directory per test (the command-line
// tests of test_io_cli.cpp and test_refusals.cpp).
#pragma once
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

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

// This build's folder: the test binary is build/tests/fa_tests, a stage's executable build/<stage>/<stage>.
inline fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

// What a child process did: its exit code (128 + the signal if one ended it), what it printed, and its peak
// resident memory in KiB.
struct ProgramResult : CliResult {
  long max_rss_kib = 0;
};

// Runs the executable `exe` with `args` in a child process. With max_file_bytes > 0, no file the child
// writes may grow past that size (RLIMIT_FSIZE, SIGXFSZ ignored): a write beyond it fails with EFBIG, the
// way a full disk fails one with ENOSPC, partway through if it straddles the limit. stdout and stderr come
// back through pipes, which the limit does not touch.
inline ProgramResult run_program(const fs::path& exe, const std::vector<std::string>& args, long max_file_bytes = 0) {
  ProgramResult r{{-1, "", ""}};
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1), ::dup2(err[1], 2);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    if (max_file_bytes > 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{rlim_t(max_file_bytes), rlim_t(max_file_bytes)};
      ::setrlimit(RLIMIT_FSIZE, &limit);
    }
    std::vector<std::string> all = {exe.string()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]), ::close(err[1]);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* into[2] = {&r.out, &r.err};
  for (int open = 2; open > 0;) {
    if (::poll(fds, 2, -1) < 0) break;
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      if (n > 0) {
        into[k]->append(buf, size_t(n));
      } else {
        ::close(fds[k].fd);
        fds[k].fd = -1;
        --open;
      }
    }
  }
  int status = 0;
  rusage usage{};
  if (pid > 0 && ::wait4(pid, &status, 0, &usage) == pid) {
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.max_rss_kib = usage.ru_maxrss;
  }
  return r;
}

}  // namespace fa::cli_test
