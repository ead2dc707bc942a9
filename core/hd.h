// FlashAttention, step by step — core/hd.h
// FA_HD marks functions that run on both the host (CPU stages, the reference) and the device (kernels).
#pragma once
#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
