// FlashAttention, step by step — harness/eval.cpp
#include "harness/eval.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "harness/git_revision.h"  // generated at build time (CMakeLists.txt): FA_GIT_REV

namespace fa {

const char* CheckReport::name(int k) {
  static const char* n[] = {"O", "LSE", "dQ", "dK", "dV", "dBias"};
  return n[k];
}

CheckReport check_against(const Oracle& oracle, const Problem& p, const Inputs& in, const Outputs& got) {
  const OutputsT<double> ref = oracle.exact(p, in);
  const Outputs base = oracle.naive_low_precision(p, in);
  CheckReport r;
  r.n = p.backward ? (p.bias ? 6 : 5) : 2;
  const Tensor* g[] = {&got.o, &got.lse, &got.dq, &got.dk, &got.dv, &got.dbias};
  const TensorT<double>* rf[] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv, &ref.dbias};
  const Tensor* bs[] = {&base.o, &base.lse, &base.dq, &base.dk, &base.dv, &base.dbias};
  for (int k = 0; k < r.n; ++k) {
    r.stage[k] = compare(*g[k], *rf[k]);
    r.baseline[k] = compare(*bs[k], *rf[k]);
    r.verdict[k] = tolerance_rule(r.stage[k], r.baseline[k]);
    r.pass = r.pass && r.verdict[k].pass;
  }
  return r;
}

// ---- timing ----------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

Timing time_runner(Runner& r, const Stage& s, bool backward) {
  using clock = std::chrono::steady_clock;
  Timing t;
  auto measure = [&](const std::function<void()>& work) {
    std::vector<double> ms;
    if (const Platform* gpu = s.platform) {
      // Warm-up, then a repetition count that fills about 0.3 s (at least 5, at most 100 runs), every run
      // from a cold L2.
      for (int i = 0; i < 3; ++i) work();
      const double once = gpu->time_ms(work, /*cold_l2=*/true);
      const int reps = std::clamp(int(300.0 / std::max(once, 1e-3)), 5, 100);
      for (int i = 0; i < reps; ++i) ms.push_back(gpu->time_ms(work, /*cold_l2=*/true));
      return median(ms);
    }
    // The CPU: one warm-up, then runs filling about 1 s (at least 3, at most 50).
    work();
    const auto t0 = clock::now();
    work();
    const double once = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    const int reps = std::clamp(int(1000.0 / std::max(once, 1e-3)), 3, 50);
    for (int i = 0; i < reps; ++i) {
      const auto a = clock::now();
      work();
      ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - a).count());
    }
    return median(ms);
  };
  t.fwd_ms = measure([&] { r.run(); });
  if (backward) {
    r.run();
    t.bwd_ms = measure([&] { r.run_backward(); });
  }
  return t;
}

// ---- device, version, records ---------------------------------------------------------------------

std::string device_name(const Stage& s) {
  if (s.platform) return s.platform->device_name();
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "CPU";
}

std::string runtime_version(const Stage& s) { return s.platform ? s.platform->runtime_version() : ""; }

std::string git_revision() { return FA_GIT_REV; }

}  // namespace fa
