// FlashAttention, step by step — gpu/tma.cpp
#include "gpu/tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "gpu/cuda_util.h"

namespace fa {

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver >= 12.0)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 3-D map of 16-bit elements: dims and byte strides (dims 1, 2) innermost first, boxes of [1, box_rows, 64].
// `what` names the tensor in the error.
static CUtensorMap encode_3d(const void* base, DType t, const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2],
                             int box_rows, bool swizzle, const std::string& what) {
  if (t == DType::fp32) throw std::invalid_argument("TMA tensor maps here are for bf16/fp16 tensors");
  CUtensorMap m;
  const cuuint32_t box[3] = {64, cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) + ") for a " + what +
                             " tensor with box rows " + std::to_string(box_rows));
  return m;
}

CUtensorMap make_tensor_map_bhnd(const void* base, DType t, int64_t BH, int64_t N, int64_t d, int box_rows,
                                 bool swizzle) {
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(N), cuuint64_t(BH)};
  const cuuint64_t strides[2] = {cuuint64_t(d) * 2, cuuint64_t(N) * cuuint64_t(d) * 2};  // bytes: a row, a head
  return encode_3d(base, t, dims, strides, box_rows, swizzle,
                   "[" + std::to_string(BH) + ", " + std::to_string(N) + ", " + std::to_string(d) + "]");
}

CUtensorMap make_tensor_map_packed(const void* base, DType t, int64_t total, int64_t H, int64_t d, int box_rows) {
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(total > 0 ? total : 1), cuuint64_t(H)};
  const cuuint64_t strides[2] = {cuuint64_t(H) * cuuint64_t(d) * 2, cuuint64_t(d) * 2};  // bytes: a token, a head
  return encode_3d(base, t, dims, strides, box_rows, /*swizzle=*/true,
                   "packed [" + std::to_string(total) + ", " + std::to_string(H) + ", " + std::to_string(d) + "]");
}

}  // namespace fa
