// FlashAttention, step by step — gpu/platform.cpp
#include "gpu/platform.h"

#include <memory>

#include "gpu/cuda_util.h"

namespace fa {
namespace {

class CudaPlatform final : public Platform {
 public:
  std::string unavailable_reason() const override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
        return std::string("no NVIDIA GPU or driver on this machine (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
      return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
    }
    return n == 0 ? "no CUDA device found" : "";
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

}  // namespace fa
