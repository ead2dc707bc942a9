// FlashAttention, step by step — common/eval.cpp
#include "eval.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "random.h"
#include "step1_cpu_reference/reference.h"
#ifdef FA_WITH_CUDA
#include "cuda_util.h"
#endif

#ifndef FA_GIT_REV
#define FA_GIT_REV "unknown"
#endif

namespace fa {

Inputs random_inputs(const Problem& p) {
  Inputs in;
  in.q = random_tensor({p.B, p.Hq, p.Nq, p.d}, p.seed, 1, 0.3f, p.dtype);
  in.k = random_tensor({p.B, p.Hkv, p.Nk, p.d}, p.seed, 2, 0.3f, p.dtype);
  in.v = random_tensor({p.B, p.Hkv, p.Nk, p.d}, p.seed, 3, 0.5f, p.dtype);
  if (p.backward) in.dout = random_tensor({p.B, p.Hq, p.Nq, p.d}, p.seed, 4, 0.5f, p.dtype);
  return in;
}

const char* CheckReport::name(int k) {
  static const char* n[] = {"O", "LSE", "dQ", "dK", "dV"};
  return n[k];
}

CheckReport check_against_reference(const Problem& p, const Inputs& in, const Outputs& got) {
  const auto ref = step1::attention<double>(p, in, p.backward);
  const auto base = step1::attention<float>(p, in, p.backward, p.dtype);
  CheckReport r;
  r.n = p.backward ? 5 : 2;
  const Tensor* g[] = {&got.o, &got.lse, &got.dq, &got.dk, &got.dv};
  const TensorT<double>* rf[] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
  const Tensor* bs[] = {&base.o, &base.lse, &base.dq, &base.dk, &base.dv};
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
  auto measure = [&](auto&& work) {
    // Warm-up, then a repetition count that fills about 0.3 s (at least 5, at most 100 runs).
    std::vector<double> ms;
#ifdef FA_WITH_CUDA
    if (s.gpu) {
      for (int i = 0; i < 3; ++i) work();
      GpuTimer timer;
      timer.flush_l2();
      const double once = timer.time(work);
      const int reps = std::clamp(int(300.0 / std::max(once, 1e-3)), 5, 100);
      for (int i = 0; i < reps; ++i) {
        timer.flush_l2();  // every run starts from cold K/V, as in a real model step
        ms.push_back(timer.time(work));
      }
      return median(ms);
    }
#endif
    (void)s;
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

std::string device_name(bool gpu) {
#ifdef FA_WITH_CUDA
  if (gpu) return gpu_name();
#endif
  (void)gpu;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "CPU";
}

std::string cuda_version() {
#ifdef FA_WITH_CUDA
  return cuda_runtime_version();
#else
  return "";
#endif
}

std::string git_revision() { return FA_GIT_REV; }

}  // namespace fa
