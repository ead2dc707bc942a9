// FlashAttention, step by step — gpu/cuda_util.h
// Host-side CUDA scaffolding shared by the GPU stages: error checking, device buffers, bf16/fp16
// uploads, and CUDA-event timing. Plain C++ over the CUDA runtime API (usable from .cpp and .cu files).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem.h"
#include "core/tensor.h"

namespace fa {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

// Every CUDA call goes through this: a failure becomes an exception naming the call and the place.
#define CUDA_CHECK(call)                                                        \
  do {                                                                          \
    cudaError_t fa_err_ = (call);                                               \
    if (fa_err_ != cudaSuccess) ::fa::throw_cuda_error(fa_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors show up here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

std::string gpu_name();
std::string cuda_runtime_version();
int compute_capability_major();  // of the current device: 9 on an H100, 12 on an RTX 50-series card
// Throws one clear message when `what` needs more shared memory per block than the current device's
// opt-in limit (227 KB on an H100, 99 KB on sm_120).
void require_smem_optin(size_t bytes, const std::string& what);

// An owning device allocation of `bytes` bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // Fills every byte with 0xff: NaN in fp32, fp16 and bf16, so an element a kernel forgets shows up.
  void poison();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device memory for one queued call of the zero-copy path (core/stage.h, Stage::run_device): allocated and
// freed in the default stream's order (cudaMallocAsync, cudaFreeAsync), so neither waits for the GPU. What is
// queued between the two on the default stream (or joined back to it) may use it.
class StreamBuffer {
 public:
  explicit StreamBuffer(size_t bytes);
  // Holding a copy of host words, written by a kernel that carries them in its parameters: a copy from
  // pageable host memory may wait for the stream, a launch does not (gpu/stream_buffer.cu).
  explicit StreamBuffer(const std::vector<int32_t>& words);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Uploads a float tensor stored as `t` (bf16, fp16 or fp32 on the device).
DeviceBuffer upload(const Tensor& x, DType t);
// Downloads `count` elements of type `t` into a float tensor of `shape`.
Tensor download(const DeviceBuffer& b, DType t, std::vector<int64_t> shape);
Tensor download_f32(const DeviceBuffer& b, std::vector<int64_t> shape);

void gpu_spin(long long cycles);  // one GPU thread busy for `cycles` clock cycles (gpu/spin.cu)

// CUDA-event timing of work launched on the default stream, with an L2 flush available between runs.
class GpuTimer {
 public:
  GpuTimer();
  ~GpuTimer();
  template <typename F>
  double time(F&& work) {
    CUDA_CHECK(cudaEventRecord(start_));
    work();
    CUDA_CHECK(cudaEventRecord(stop_));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }
  void flush_l2();  // writes a buffer twice the L2 size, outside any timed region
  // A microbenchmark's time (docs/bench/mma_peak, step 7's wgmma_peak): two warm-up runs of `work` (clocks
  // up, code loaded), then the median of `reps` timed ones, in ms. No L2 flush: such loops read no memory.
  template <typename F>
  double median_ms(F&& work, int reps) {
    for (int i = 0; i < 2; ++i) work();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) ms.push_back(time(work));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  long long lead_cycles_ = 0;  // GPU cycles spun after each flush (FA_TIMING_LEAD_CYCLES; default 0)
  cudaEvent_t start_, stop_;
  DeviceBuffer scratch_;
};

}  // namespace fa
