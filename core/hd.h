// FlashAttention, step by step — core/hd.h
// FA_HD marks functions that run on both the host (CPU stages, the reference) and the device (kernels).
#pragma once
#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif

// FA_UNROLL: "#pragma unroll" in nvcc's device pass, nothing in a host compiler's (gcc warns about it): for
// the loops of FA_HD functions that the host tests run too.
#if defined(__CUDA_ARCH__)
#define FA_UNROLL _Pragma("unroll")
#else
#define FA_UNROLL
#endif
