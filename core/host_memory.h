// FlashAttention, step by step — core/host_memory.h
// How much memory this machine can give a process now, and the refusal of a run that would need more.
// The CPU stages materialise [Nq, Nk] matrices (step 1 several per head, in fp64 for --check): a long
// sequence can need more memory than the machine has, and the harness says so before allocating any of
// it, rather than failing halfway through a run or being killed by the kernel's out-of-memory killer.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "core/problem.h"

namespace fa {

// Bytes the machine can give without swapping: MemAvailable of /proc/meminfo (Linux's own estimate, which
// counts the caches it can drop), else the free physical pages; 0 when neither can be read.
inline double available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line))
    if (line.rfind("MemAvailable:", 0) == 0) return 1024.0 * std::stod(line.substr(13));  // "... 23766784 kB"
  const long pages = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_bytes > 0 ? double(pages) * double(page_bytes) : 0.0;
}

// "37.3 GiB", "512 MiB".
inline std::string memory_str(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / (1024.0 * 1024));
  return buf;
}

// Throws std::runtime_error when `bytes` exceed the available memory (nothing is refused when that cannot
// be read): "not enough memory for <what>: about 37.3 GiB needed, 21.9 GiB available; try ...".
inline void require_host_memory(double bytes, const std::string& what) {
  const double available = available_host_memory();
  if (available > 0 && bytes > available)
    throw std::runtime_error("not enough memory for " + what + ": about " + memory_str(bytes) + " needed, " +
                             memory_str(available) + " available; try a smaller batch, fewer heads or "
                             "shorter sequences");
}

// Elements of the outputs of a run of p: O and LSE, and dQ, dK, dV for a backward.
inline double output_elements(const Problem& p) {
  const double o = double(p.B) * double(p.Hq) * double(p.Nq) * double(p.d), lse = double(p.B) * double(p.Hq) * double(p.Nq);
  const double grads = p.backward ? o + 2 * double(p.B) * double(p.Hkv) * double(p.Nk) * double(p.d) : 0.0;
  return o + lse + grads;
}

// Elements of the inputs of p: Q, K, V, and dO for a backward.
inline double input_elements(const Problem& p) {
  const double q = double(p.B) * double(p.Hq) * double(p.Nq) * double(p.d);
  return q * (p.backward ? 2 : 1) + 2 * double(p.B) * double(p.Hkv) * double(p.Nk) * double(p.d);
}

}  // namespace fa
