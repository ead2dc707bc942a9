// FlashAttention, step by step — gpu/platform.cpp
#include "gpu/platform.h"

#include <memory>
#include <string>

#include "gpu/cuda_util.h"

namespace fa {
namespace {

std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// Why this machine cannot run the GPU stages, in words that say what to do about it ("" when it can).
std::string cuda_device_problem() {
  int n = 0, driver = 0, runtime = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  cudaGetLastError();  // clear the error, so that it does not surface in a later CUDA call
  // The runtime says "insufficient driver" both when the driver is older than the toolkit and when there is
  // no driver at all; cudaDriverGetVersion tells them apart (0: none). Only the first is fixed by an update.
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if ((e == cudaSuccess && n == 0) || e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && driver == 0))
    return "no NVIDIA GPU or driver on this machine";
  if (e == cudaErrorInsufficientDriver && driver < runtime)
    return "the NVIDIA driver (CUDA " + cuda_version(driver) + ") is older than this CUDA toolkit needs (CUDA " +
           cuda_version(runtime) + "): update the driver";
  if (e != cudaSuccess) return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  // The stages' kernels need mma.sync on bf16, ldmatrix and cp.async: sm_80 and later. Which of them run on
  // an sm_8x part (no TMA) each stage says itself (TmaPlatform below; step 4's variants).
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major < 8)
    return "GPU " + gpu_name() + " (sm_" + std::to_string(major) + std::to_string(minor) +
           ") is older than sm_80, which the GPU stages need (mma.sync on bf16, cp.async)";
  return "";
}

class CudaPlatform final : public Platform {
 public:
  std::string unavailable_reason() const override {
    static const std::string why = cuda_device_problem();  // asked once: the answer does not change
    return why;
  }
  std::string device_name() const override { return gpu_name(); }
  std::string runtime_version() const override { return cuda_runtime_version(); }
  int compute_capability_major() const override { return fa::compute_capability_major(); }
  double time_ms(const std::function<void()>& work, bool cold_l2) const override {
    if (!timer_) timer_ = std::make_unique<GpuTimer>();  // made on first use: its L2-sized scratch buffer
    if (cold_l2) timer_->flush_l2();
    return timer_->time(work);
  }

 private:
  mutable std::unique_ptr<GpuTimer> timer_;
};

}  // namespace

const Platform& cuda_platform() {
  static const CudaPlatform platform;
  return platform;
}

std::string NarrowedPlatform::unavailable_reason() const {
  if (std::string why = cuda_platform().unavailable_reason(); !why.empty()) return why;
  const int major = cuda_platform().compute_capability_major();
  if (major < min_major_ || (max_major_ > 0 && major > max_major_))
    return std::string(needs_) + "; " + cuda_platform().device_name() + " is sm_" + std::to_string(major) + "x";
  return "";
}
std::string NarrowedPlatform::device_name() const { return cuda_platform().device_name(); }
std::string NarrowedPlatform::runtime_version() const { return cuda_platform().runtime_version(); }
int NarrowedPlatform::compute_capability_major() const { return cuda_platform().compute_capability_major(); }
double NarrowedPlatform::time_ms(const std::function<void()>& work, bool cold_l2) const {
  return cuda_platform().time_ms(work, cold_l2);
}

const Platform& tma_platform() {
  static const NarrowedPlatform platform(9, 0, "this stage loads its tiles with TMA and mbarrier transaction counts "
                                               "(sm_90 and later: an H100, H200, B200 or RTX 50-series card)");
  return platform;
}

}  // namespace fa
