// FlashAttention, step by step — gpu/cuda_util.cpp
#include "gpu/cuda_util.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/dtype.h"

namespace fa {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                           ") in " + what + " at " + file + ":" + std::to_string(line));
}

std::string gpu_name() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

std::string cuda_runtime_version() {
  int v = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&v));
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

int compute_capability_major() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
}

void require_smem_optin(size_t bytes, const std::string& what) {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (size_t(optin) < bytes)
    throw std::runtime_error(what + " needs " + std::to_string(bytes) +
                             " bytes of shared memory per block; the device allows " + std::to_string(optin));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error("not enough GPU memory: asked for " + std::to_string(bytes >> 20) + " MiB, " +
                             std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::poison() {
  if (ptr_) CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_));
}

DeviceBuffer upload(const Tensor& x, DType t) {
  DeviceBuffer b(x.size() * size_t(dtype_bytes(t)));
  if (t == DType::fp32) {
    CUDA_CHECK(cudaMemcpy(b.get(), x.ptr(), b.bytes(), cudaMemcpyHostToDevice));
    return b;
  }
  std::vector<uint16_t> h(x.size());
  const int64_t n = int64_t(x.size());
#pragma omp parallel for schedule(static)  // a decode problem's KV cache has billions of elements
  for (int64_t i = 0; i < n; ++i)
    h[size_t(i)] = t == DType::bf16 ? float_to_bf16_bits(x.data[size_t(i)]) : float_to_fp16_bits(x.data[size_t(i)]);
  CUDA_CHECK(cudaMemcpy(b.get(), h.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}

Tensor download(const DeviceBuffer& b, DType t, std::vector<int64_t> shape) {
  if (t == DType::fp32) return download_f32(b, std::move(shape));
  Tensor x(std::move(shape));
  std::vector<uint16_t> h(x.size());
  CUDA_CHECK(cudaMemcpy(h.data(), b.get(), h.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < x.size(); ++i)
    x.data[i] = t == DType::bf16 ? bf16_bits_to_float(h[i]) : fp16_bits_to_float(h[i]);
  return x;
}

Tensor download_f32(const DeviceBuffer& b, std::vector<int64_t> shape) {
  Tensor x(std::move(shape));
  CUDA_CHECK(cudaMemcpy(x.ptr(), b.get(), x.size() * 4, cudaMemcpyDeviceToHost));
  return x;
}

GpuTimer::GpuTimer() {
  CUDA_CHECK(cudaEventCreate(&start_));
  CUDA_CHECK(cudaEventCreate(&stop_));
  int dev = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  scratch_ = DeviceBuffer(size_t(2) * size_t(l2));
  // The lead (docs/conventions.md, timing): after each L2 flush the GPU spins this many cycles before the start
  // event. docs/bench/sweep.py sets it to the lead its PyTorch peers get, so that both sides are timed alike.
  if (const char* s = std::getenv("FA_TIMING_LEAD_CYCLES"); s && *s) {
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (*end != '\0' || v < 0)
      throw std::invalid_argument(std::string("FA_TIMING_LEAD_CYCLES must be a number of GPU cycles >= 0, not '") + s + "'");
    lead_cycles_ = v;
  }
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
}

void GpuTimer::flush_l2() {
  CUDA_CHECK(cudaMemsetAsync(scratch_.get(), 0, scratch_.bytes()));
  if (lead_cycles_ > 0) gpu_spin(lead_cycles_);
}

}  // namespace fa
