// FlashAttention, step by step — capi/staging.h
// Between the C interface's strided tensors (capi/flash_step.h: [B, N, H, d], any strides, any of four
// dtypes, host or device memory) and the stages' tensors (core/stage.h: float32 [B, H, N, d], contiguous,
// on the host). Device memory is copied through the host: the stage interface takes host tensors, and a GPU
// stage uploads them itself.
#pragma once
#include <string>

#include "capi/flash_step.h"
#include "core/tensor.h"

namespace fa::capi {

// The bytes of one element of `t`, and its name ("fp32", "bf16", ...).
int element_bytes(fs_dtype t);
const char* dtype_str(fs_dtype t);

// Reads a [B, N, H, d] view into a float32 tensor [B, H, N, d] (rounded to fp32 when the view is fp64).
Tensor gather_bnhd(const fs_tensor& t, fs_dtype dtype, fs_memory memory);
// Writes a [B, H, N, d] tensor (float or double) into a [B, N, H, d] view, converting to `dtype`
// (round to nearest even for fp16 and bf16). Only the view's elements are written.
void scatter_bnhd(const TensorT<float>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory);
void scatter_bnhd(const TensorT<double>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory);
// A packed batch (flash_attn_varlen_func's [total, H, d], seen as a [1, total, H, d] view) to and from the
// stages' [total, H, d] (core/varlen.h): the view's own order.
Tensor gather_packed(const fs_tensor& t, fs_dtype dtype, fs_memory memory);
void scatter_packed(const TensorT<float>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory);
void scatter_packed(const TensorT<double>& src, const fs_tensor& t, fs_dtype dtype, fs_memory memory);
// The LSE [B, H, Nq] (or a packed batch's [Hq, total_q] into a [1, Hq, total_q] view), written as fp32, or fp64
// from a double tensor.
void scatter_lse(const TensorT<float>& src, const fs_tensor& t, fs_memory memory);
void scatter_lse(const TensorT<double>& src, const fs_tensor& t, fs_memory memory);

// "" when `ptr` is memory of the current CUDA device, otherwise why not ("host memory", "device 1, not the
// current device 0"); throws std::runtime_error in a build without the GPU stages.
std::string device_pointer_problem(const void* ptr);
// Waits for the copies to the device (the outputs are complete when a call returns).
void device_synchronize();

}  // namespace fa::capi
