// FlashAttention, step by step — gpu/gpu_runner.h
// Scaffolding every GPU stage shares: the kernel parameter block and a Runner that owns the device
// tensors. A stage derives from GpuRunner and writes only run() (and run_backward()): the lesson.
#pragma once
#include <cstdint>

#include "gpu/cuda_util.h"
#include "core/dropout.h"
#include "core/stage.h"

namespace fa {

// What a forward kernel needs, passed by value. Tensors are contiguous [B, H, N, d].
struct AttnParams {
  const void* q;  // [B, Hq, Nq, d]   element type T (bf16, fp16 or fp32)
  const void* k;  // [B, Hkv, Nk, d]
  const void* v;  // [B, Hkv, Nk, d]
  void* o;        // [B, Hq, Nq, d]
  float* lse;     // [B, Hq, Nq]      natural log; nullptr in an inference run
  int B, Hq, Hkv, Nq, Nk, d;
  int group;         // Hq / Hkv: query head h reads KV head h / group
  bool causal;
  int64_t input_pos; // absolute position of query row 0
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e): exp(scale * s) = exp2(scale_log2 * s)
  DropoutParams dropout;
};

class GpuRunner : public Runner {
 public:
  // Uploads Q, K, V in the problem's dtype, allocates O and LSE and poisons them with NaN.
  GpuRunner(const Problem& p, const Inputs& in);
  Outputs outputs() override;  // synchronises, downloads, returns float32 tensors

 protected:
  Problem p_;
  DeviceBuffer q_, k_, v_, o_, lse_;
  AttnParams params_{};
};

}  // namespace fa
