/* FlashAttention, step by step — capi/flash_step.h
 * The C interface over the stages (libflash_step.so): attention forward (O, LSE) and backward (dQ, dK, dV)
 * on host pointers, served by the CPU stages (step 1's reference in fp64 or fp32, step 2's tiled
 * FlashAttention), or on device pointers, served by the GPU stages (steps 3-7), through the registry
 * (harness/registry.h). docs/interface.md explains it; python/flash_step/ wraps it with ctypes.
 *
 * Layout: Q, O, dO, dQ [B, Nq, Hq, d] and K, V, dK, dV [B, Nk, Hkv, d], as FlashAttention's
 * flash_attn_func; the LSE [B, Hq, Nq] (natural log). Any strides, in elements (negative ones too); the
 * outputs must not overlap themselves (no zero stride along a dimension of size > 1).
 *
 * Every call returns a status; on anything but FS_OK, fs_last_error() says why, in one sentence. No call
 * aborts, and no C++ exception crosses this interface. The last error is per thread.
 *
 * Device memory, two paths. The zero-copy path: a bf16/fp16 call on steps 4, 5 or 7 (the default stages for
 * device memory), d = 64 or 128, every [B, N, H, d] tensor contiguous and 16-byte aligned, runs the kernels on the
 * caller's tensors, queued on the CUDA legacy default stream (stream 0): the call returns once they are queued,
 * and work the caller queues on that stream afterwards sees the outputs. The LSE is read and written in place
 * when laid out [Hq, B, Nq] (strides Nq, B * Nq, 1 of the [B, Hq, Nq] view), else through a device scratch.
 * Every other device call copies its tensors through the host and returns when its outputs are complete.
 * fs_last_call_copied() says which path a call took.
 */
#ifndef FLASH_STEP_H
#define FLASH_STEP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The interface's version: the major number changes when a call or a struct changes incompatibly. */
#define FS_VERSION_MAJOR 1
#define FS_VERSION_MINOR 2
#define FS_VERSION (FS_VERSION_MAJOR * 1000 + FS_VERSION_MINOR)

#if defined(__GNUC__)
#define FS_API __attribute__((visibility("default")))
#else
#define FS_API
#endif

typedef enum fs_status {
  FS_OK = 0,
  FS_INVALID_ARGUMENT = 1, /* a null pointer, a bad size or stride, tensors whose shapes disagree, a bad option */
  FS_UNKNOWN_STAGE = 2,    /* no stage (or no variant of the stage) by that name in this build */
  FS_UNSUPPORTED = 3,      /* the stage cannot run these options: dtype, head dim, backward, memory kind */
  FS_UNAVAILABLE = 4,      /* the GPU stages cannot run here: not built, no GPU or driver, the wrong GPU */
  FS_OUT_OF_MEMORY = 5,    /* the host (or the device) has not enough memory for the run */
  FS_RUNTIME_ERROR = 6     /* anything else that failed while running (a CUDA error, ...) */
} fs_status;

typedef enum fs_dtype {
  FS_FP32 = 0, /* host (steps 1 and 2 compute in fp32); device: step 3 only */
  FS_FP64 = 1, /* host: step 1's fp64 reference (inputs pass through fp32: docs/interface.md) */
  FS_FP16 = 2, /* device */
  FS_BF16 = 3  /* device */
} fs_dtype;

typedef enum fs_memory {
  FS_HOST = 0,  /* host pointers: the CPU stages */
  FS_DEVICE = 1 /* CUDA device pointers (current device): the GPU stages */
} fs_memory;

/* A strided view. Q, K, V, O, dO, dQ, dK, dV: ndim 4, size and stride in [B, N, H, d] order; the LSE: ndim 3,
 * [B, Hq, Nq]. Elements have the call's dtype, except the LSE: fp64 with FS_FP64, fp32 otherwise. */
typedef struct fs_tensor {
  void* data;        /* the element at index 0 (with negative strides, not the lowest address) */
  int32_t ndim;      /* 4, or 3 for the LSE */
  int64_t size[4];   /* elements along each dimension */
  int64_t stride[4]; /* elements between neighbours along each dimension */
} fs_tensor;

typedef struct fs_options {
  int32_t causal;       /* 1: query i sees key j iff j <= i + Nk - Nq (bottom-right, as flash_attn_func) */
  double softmax_scale; /* 0: 1 / sqrt(d); otherwise positive and finite */
  fs_dtype dtype;       /* of Q, K, V, O and the gradients */
  fs_memory memory;     /* where every pointer of the call points */
  const char* stage;    /* a stage's name ("step2_online_softmax"), or NULL: the default (fs_resolve) */
  const char* variant;  /* a variant of that stage, or NULL: its first variant that runs the call */
} fs_options;

/* FS_VERSION of the library (which may be newer than the header a program was compiled with). */
FS_API int32_t fs_version(void);
/* Why the last call of this thread failed, in one sentence; "" after a call that succeeded. */
FS_API const char* fs_last_error(void);
/* How this thread's last call that succeeded ran: 0 on the caller's device tensors in place (the zero-copy
 * path), 1 through copies on the host, -1 for a call on host memory (or none yet). Since version 1.2. */
FS_API int32_t fs_last_call_copied(void);

/* Options with every field at its default: not causal, scale 1/sqrt(d), FS_FP32, FS_HOST, default stage. */
FS_API fs_options fs_default_options(void);
/* A contiguous [B, N, H, d] view of `data`, and a contiguous [B, H, Nq] one for the LSE. */
FS_API fs_tensor fs_contiguous(void* data, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);
FS_API fs_tensor fs_contiguous_lse(void* data, int64_t batch, int64_t heads, int64_t seqlen_q);

/* Forward: O = softmax(scale Q K^T, masked) V and LSE = log of each row's sum of exp(scores). A query head
 * h reads KV head h / (Hq / Hkv) (GQA, MQA). A row that sees no key gets O = 0 and LSE = -inf. */
FS_API fs_status fs_forward(const fs_options* options, const fs_tensor* q, const fs_tensor* k, const fs_tensor* v,
                            const fs_tensor* o, const fs_tensor* lse);

/* Forward from a KV cache, as FlashAttention's flash_attn_with_kvcache decodes: sequence b holds
 * cache_seqlens[b] keys (NULL: every sequence is full) and its Nq queries are its last positions (causal is
 * bottom-right in each sequence). Without a block table, k_cache and v_cache are [B, Nk, Hkv, d], Nk the
 * capacity. With one, they are a pool of pages [num_pages, page_size, Hkv, d] (FlashAttention's paged layout)
 * and block_table [B, pages_per_seq] says which page holds keys n * page_size .. (n + 1) * page_size - 1 of
 * sequence b; entries past a sequence's length are not read. cache_seqlens and block_table are host arrays of
 * int32. In this version the keys are gathered (copied) into the stage's own cache, which step 4's split-KV
 * kernel reads in pages of page_size keys when 128 divides it (docs/interface.md). Host memory: step 1 reads
 * the gathered cache (fp32, or fp64: the reference). */
FS_API fs_status fs_forward_kvcache(const fs_options* options, const fs_tensor* q, const fs_tensor* k_cache,
                                    const fs_tensor* v_cache, const int32_t* cache_seqlens,
                                    const int32_t* block_table, int32_t pages_per_seq, const fs_tensor* o,
                                    const fs_tensor* lse);

/* A packed variable-length batch, as flash_attn_varlen_func takes it: the sequences end to end, q and o
 * [1, total_q, Hq, d], k, v [1, total_k, Hkv, d] (a batch of one), the LSE [1, Hq, total_q];
 * cu_seqlens_q and cu_seqlens_k (host int32, batch + 1 entries each, from 0) say where each sequence starts.
 * Sequence b's queries see only its own keys, causal bottom-right in them. The CPU stages run it sequence by
 * sequence (steps 1 and 2: core/varlen.h); on the GPU, step 4's forward (4g), step 7's (7e) and step 5's
 * backward read the offsets themselves, one launch per kernel. Without a stage named, a GPU call goes to step 7
 * on an sm_90 GPU (7e), else to step 5 (4g). The backward reads O and the LSE on the zero-copy path. */
FS_API fs_status fs_forward_varlen(const fs_options* options, const fs_tensor* q, const fs_tensor* k,
                                   const fs_tensor* v, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                   int32_t batch, const fs_tensor* o, const fs_tensor* lse);
FS_API fs_status fs_backward_varlen(const fs_options* options, const fs_tensor* q, const fs_tensor* k,
                                    const fs_tensor* v, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                    int32_t batch, const fs_tensor* o, const fs_tensor* lse, const fs_tensor* dout,
                                    const fs_tensor* dq, const fs_tensor* dk, const fs_tensor* dv);

/* Backward: dQ, dK, dV from dO, with the O and LSE of the forward. dK and dV are summed over the query heads
 * of their KV head. The zero-copy path reads the O and LSE given; the copy path recomputes them with the stage's
 * own forward (the stage interface runs a backward after its forward: core/stage.h) and only checks them. */
FS_API fs_status fs_backward(const fs_options* options, const fs_tensor* q, const fs_tensor* k,
                             const fs_tensor* v, const fs_tensor* o, const fs_tensor* lse, const fs_tensor* dout,
                             const fs_tensor* dq, const fs_tensor* dk, const fs_tensor* dv);

/* The stage and variant a call would run (the default, or the one named, checked): points to names that
 * live as long as the library. backward: 0 for fs_forward, 1 for fs_backward. */
FS_API fs_status fs_resolve(const fs_options* options, const fs_tensor* q, const fs_tensor* k, int32_t backward,
                            const char** stage, const char** variant);

/* The stages of this build, in tutorial order: fs_stage_name(i) for i < fs_stage_count(), NULL past the
 * end; fs_stage_memory(i): the memory kind it serves. */
FS_API int32_t fs_stage_count(void);
FS_API const char* fs_stage_name(int32_t index);
FS_API fs_memory fs_stage_memory(int32_t index);
/* Why the GPU stages cannot run here ("" when they can): not built, no GPU or driver, ... */
FS_API const char* fs_gpu_unavailable_reason(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASH_STEP_H */
