// FlashAttention, step by step — common/ptx.h
// Thin wrappers over the PTX instructions the tensor-core stages use, each citing the PTX ISA section it
// follows and saying in scalar terms what it does. Only instructions that sm_90 (H100) and sm_120
// (RTX 50-series) both have: mma.sync, ldmatrix, cp.async.bulk.tensor (TMA) and mbarrier. No wgmma.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fa::ptx {

// ---- tensor cores -------------------------------------------------------------------------------
// PTX ISA 9.7.14.5.8 "mma.sync.aligned.m16n8k16" (bf16 / f16 inputs, f32 accumulators).
// Scalar meaning: D[16x8] = A[16x16] * B[16x8] + C[16x8], computed by the 32 threads of a warp together.
// Fragments (per thread, lane = 4 * group + t, group = lane / 4, t = lane % 4):
//   a[4] (4 x 2 halves): A[group][2t..2t+1], A[group+8][2t..], A[group][2t+8..], A[group+8][2t+8..]
//   b[2] (2 x 2 halves): B[2t..2t+1][group], B[2t+8..2t+9][group]
//   c[4]:                C[group][2t], C[group][2t+1], C[group+8][2t], C[group+8][2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Packs two floats into one register of two 16-bit values (lo in the low half), rounding to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- shared memory -> registers -----------------------------------------------------------------
// PTX ISA 9.7.9.24 "ldmatrix.sync.aligned.m8n8.x4.shared.b16".
// Scalar meaning: four 8x8 matrices of 16-bit elements are read from shared memory; lanes 8k..8k+7 give
// the row addresses of matrix k (16 contiguous bytes each); afterwards thread `lane` holds, in r[k],
// elements (lane / 4, 2 * (lane % 4) .. +1) of matrix k: exactly an mma fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
// The same with each 8x8 matrix transposed on the way (".trans"): thread `lane` gets elements
// (2 * (lane % 4) .. +1, lane / 4). Used for V in O += P V, whose rows are keys, not output columns.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace fa::ptx
