// FlashAttention, step by step — core/parallel.h
// The one parallel loop of the CPU stages: every (i, j) of an n0 x n1 grid (batch x heads), spread over
// OpenMP threads, and how many of its iterations run at once (each holds its own buffers).
//
// An exception must not leave an OpenMP parallel region: the runtime ends the program with
// std::terminate ("terminate called ..."), however many catch blocks wait outside. So each iteration
// catches what it throws (a failed allocation, typically); the first exception stops the iterations not
// yet started and is rethrown once the region has ended, where the caller's handlers can see it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace fa {

template <typename Body>
void parallel_for_2d(int64_t n0, int64_t n1, const Body& body) {
  std::exception_ptr first_error;
  std::atomic<bool> failed{false};
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        body(i, j);
      } catch (...) {
#pragma omp critical(fa_parallel_for_2d_error)
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  if (first_error) std::rethrow_exception(first_error);
}

// The iterations of a parallel_for_2d over `tasks` that run at the same time: one per thread.
inline int64_t parallel_workers(int64_t tasks) {
#ifdef _OPENMP
  return std::max<int64_t>(1, std::min<int64_t>(tasks, omp_get_max_threads()));
#else
  return 1;
#endif
}

}  // namespace fa
