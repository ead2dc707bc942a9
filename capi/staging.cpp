// FlashAttention, step by step — capi/staging.cpp
// The strided gathers and scatters between the C interface's views and the stages' float32 tensors, and
// the copies of device memory through the host (capi/staging.h).
#include "capi/staging.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/dtype.h"

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fa::capi {

int element_bytes(fs_dtype t) { return t == FS_FP64 ? 8 : t == FS_FP32 ? 4 : 2; }

const char* dtype_str(fs_dtype t) {
  switch (t) {
    case FS_FP32: return "fp32";
    case FS_FP64: return "fp64";
    case FS_FP16: return "fp16";
    case FS_BF16: return "bf16";
  }
  return "an unknown dtype";
}

namespace {

// ---- device memory, through the host -------------------------------------------------------------

// bytes from `src` to `dst`, one of them device memory: to the device, or back to the host.
void copy_device(void* dst, const void* src, size_t bytes, bool to_device) {
#ifdef FA_WITH_CUDA
  const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  if (const cudaError_t e = cudaMemcpy(dst, src, bytes, kind); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaMemcpy ") + (to_device ? "to" : "from") + " the device failed: " +
                             cudaGetErrorString(e));
#else
  (void)dst, (void)src, (void)bytes, (void)to_device;
  throw std::runtime_error("device memory needs the GPU stages, which this build left out");
#endif
}

// The memory a view spans, as element offsets from its element 0: [lo, hi], negative strides included.
struct Span {
  int64_t lo = 0, hi = 0;
  explicit Span(const fs_tensor& t) {
    for (int k = 0; k < t.ndim; ++k) {
      const int64_t extent = (t.size[k] - 1) * t.stride[k];
      (extent < 0 ? lo : hi) += extent;
    }
  }
  int64_t count() const { return hi - lo + 1; }
};

// The view's memory as the host sees it: the memory itself for a host view; for a device view a host copy
// of its span, read from the device when asked (an input, or an output that does not cover its span) and
// written back by flush().
class HostImage {
 public:
  HostImage(const fs_tensor& t, int es, fs_memory memory, bool read) : span_(t), es_(es), memory_(memory) {
    start_ = static_cast<char*>(t.data) + span_.lo * es_;
    if (memory_ == FS_HOST) return;
    int64_t elements = 1;
    for (int k = 0; k < t.ndim; ++k) elements *= t.size[k];
    copy_.resize(size_t(span_.count()) * size_t(es_));
    if (read || elements != span_.count()) copy_device(copy_.data(), start_, copy_.size(), /*to_device=*/false);
  }
  char* at(int64_t offset) { return (memory_ == FS_HOST ? start_ : copy_.data()) + (offset - span_.lo) * es_; }
  void flush() {
    if (memory_ == FS_DEVICE) copy_device(start_, copy_.data(), copy_.size(), /*to_device=*/true);
  }

 private:
  Span span_;
  int es_;
  fs_memory memory_;
  char* start_;  // the lowest address of the span, in the view's own memory
  std::vector<char> copy_;
};

float load(const char* p, fs_dtype t) {
  switch (t) {
    case FS_FP32: { float x; std::memcpy(&x, p, 4); return x; }
    case FS_FP64: { double x; std::memcpy(&x, p, 8); return float(x); }
    case FS_FP16: { uint16_t h; std::memcpy(&h, p, 2); return fp16_bits_to_float(h); }
    case FS_BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_bits_to_float(h); }
  }
  return 0;
}

template <typename T>
void store(char* p, fs_dtype t, T value) {
  switch (t) {
    case FS_FP32: { const float x = float(value); std::memcpy(p, &x, 4); return; }
    case FS_FP64: { const double x = double(value); std::memcpy(p, &x, 8); return; }
    case FS_FP16: { const uint16_t h = float_to_fp16_bits(float(value)); std::memcpy(p, &h, 2); return; }
    case FS_BF16: { const uint16_t h = float_to_bf16_bits(float(value)); std::memcpy(p, &h, 2); return; }
  }
}

// f(i, offset) for every element, i its index in the stages' contiguous order (dims n[0..3]), offset its
// place in the view (strides s[0..3] of those dims).
template <typename F>
void for_each_element(const int64_t n[4], const int64_t s[4], F&& f) {
  size_t i = 0;
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c) {
        const int64_t row = a * s[0] + b * s[1] + c * s[2];
        for (int64_t x = 0; x < n[3]; ++x) f(i++, row + x * s[3]);
      }
}

// The stages' [B, H, N, d] order over a [B, N, H, d] view: dims 1 and 2 swapped.
void stage_order(const fs_tensor& t, int64_t n[4], int64_t s[4]) {
  const int from[4] = {0, 2, 1, 3};
  for (int k = 0; k < 4; ++k) {
    n[k] = t.size[from[k]];
    s[k] = t.stride[from[k]];
  }
}

// How a view's elements line up with a stage's tensor: [B, N, H, d] as [B, H, N, d] (stage_order), a
// 4-D view in its own order (a packed batch: [1, total, H, d] as [total, H, d]), or a 3-D LSE as it is.
enum class Order { kStages, kView, kLse };
void order_of(const fs_tensor& t, Order order, int64_t n[4], int64_t s[4]) {
  for (int k = 0; k < 4; ++k) {
    n[k] = k < t.ndim ? t.size[k] : 1;
    s[k] = k < t.ndim ? t.stride[k] : 0;
  }
  if (order == Order::kStages) stage_order(t, n, s);
}

Tensor gather(const fs_tensor& t, fs_dtype dtype, fs_memory memory, Order order, std::vector<int64_t> shape) {
  int64_t n[4], s[4];
  order_of(t, order, n, s);
  Tensor out(std::move(shape));
  HostImage image(t, element_bytes(dtype), memory, /*read=*/true);
  for_each_element(n, s, [&](size_t i, int64_t off) { out.data[i] = load(image.at(off), dtype); });
  return out;
}

template <typename T>
void scatter(const TensorT<T>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory, Order order) {
  int64_t n[4], s[4];
  order_of(t, order, n, s);
  if (TensorT<T>::count({n[0], n[1], n[2], n[3]}) != src.size())
    throw std::logic_error("a stage's output has " + std::to_string(src.size()) + " elements, the view " +
                           std::to_string(TensorT<T>::count({n[0], n[1], n[2], n[3]})));
  HostImage image(t, element_bytes(dtype), memory, /*read=*/false);
  for_each_element(n, s, [&](size_t i, int64_t off) { store(image.at(off), dtype, src.data[i]); });
  image.flush();
}

}  // namespace

Tensor gather_bnhd(const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  return gather(t, dtype, memory, Order::kStages, {t.size[0], t.size[2], t.size[1], t.size[3]});
}
Tensor gather_packed(const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  return gather(t, dtype, memory, Order::kView, {t.size[1], t.size[2], t.size[3]});
}

void scatter_bnhd(const TensorT<float>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  scatter(src, t, dtype, memory, Order::kStages);
}
void scatter_bnhd(const TensorT<double>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  scatter(src, t, dtype, memory, Order::kStages);
}
void scatter_packed(const TensorT<float>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  scatter(src, t, dtype, memory, Order::kView);
}
void scatter_packed(const TensorT<double>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory) {
  scatter(src, t, dtype, memory, Order::kView);
}
void scatter_lse(const TensorT<float>& src, const fs_tensor& t, fs_memory memory) {
  scatter(src, t, FS_FP32, memory, Order::kLse);
}
void scatter_lse(const TensorT<double>& src, const fs_tensor& t, fs_memory memory) {
  scatter(src, t, FS_FP64, memory, Order::kLse);
}

std::string device_pointer_problem(const void* ptr) {
#ifdef FA_WITH_CUDA
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: an unknown pointer is an answer here, not a failure
    return "memory CUDA does not know (a host pointer?)";
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return "host memory";
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && a.device != current)
    return "memory of device " + std::to_string(a.device) + ", not of the current device " + std::to_string(current) +
           " (cudaSetDevice)";
  return "";
#else
  (void)ptr;
  throw std::runtime_error("device memory needs the GPU stages, which this build left out");
#endif
}

void device_synchronize() {
#ifdef FA_WITH_CUDA
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    throw std::runtime_error(std::string("cudaDeviceSynchronize failed: ") + cudaGetErrorString(e));
#endif
}

}  // namespace fa::capi
