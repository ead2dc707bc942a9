// FlashAttention, step by step — gpu/gpu_types.h
// Element types on the device and the one place that turns a run-time dtype / head dim into template
// arguments, so no stage repeats a switch statement.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/problem.h"

namespace fa {

// Shared memory one block may use with the opt-in attribute: 99 KB on sm_120 (RTX 50-series, the course's
// target), 227 KB on sm_90 (the H100 it is tested on). Default configurations must fit the first.
constexpr size_t kSm120SmemBytes = 99 * 1024;
constexpr size_t kSm90SmemBytes = 227 * 1024;

// What a block may opt into on the architecture a device pass compiles for: 227 KB on sm_90 and sm_100,
// 163 KB on sm_80 and sm_87, 99 KB on the others (sm_86, sm_89, sm_120). The host pass takes the largest.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870)
constexpr size_t kArchSmemBytes = 163 * 1024;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900 && __CUDA_ARCH__ != 1000 && __CUDA_ARCH__ != 1030
constexpr size_t kArchSmemBytes = kSm120SmemBytes;
#else
constexpr size_t kArchSmemBytes = kSm90SmemBytes;
#endif

// The first statement of a kernel template whose block needs `bytes` of shared memory. Where the architecture
// cannot give them, the kernel is a trap and the compiler drops the rest of its body: nothing is compiled that
// cannot run there (the host refuses the launch first: require_smem_optin). Elsewhere it is no code at all.
#define FA_KERNEL_NEEDS_SMEM(bytes)            \
  if constexpr ((bytes) > ::fa::kArchSmemBytes) { \
    __trap();                                   \
    return;                                     \
  }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

// Calls f(T{}) with T the device type of `t`. kAllowFp32 = false (tensor-core stages) rejects fp32
// without instantiating f for it.
template <bool kAllowFp32, typename F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::fp16: f(__half{}); return;
    case DType::fp32:
      if constexpr (kAllowFp32) f(float{});
      else throw std::invalid_argument("fp32 is not supported by this stage (bf16 or fp16)");
      return;
  }
}

// Calls f(std::integral_constant<int, D>{}) for the supported head dims 64 and 128.
template <typename F>
void dispatch_head_dim(int d, F&& f) {
  if (d == 64) return f(std::integral_constant<int, 64>{});
  if (d == 128) return f(std::integral_constant<int, 128>{});
  throw std::invalid_argument("head dim " + std::to_string(d) + " is not supported (64 or 128)");
}

inline std::string head_dim_unsupported(int64_t d) {
  return d == 64 || d == 128 ? "" : "head dim " + std::to_string(d) + " is not supported (64 or 128)";
}

}  // namespace fa
