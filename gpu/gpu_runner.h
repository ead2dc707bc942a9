// FlashAttention, step by step — gpu/gpu_runner.h
// Scaffolding every GPU stage shares: the kernel parameter block and a Runner that owns the device
// tensors. A stage derives from GpuRunner and writes only run() (and run_backward()): the lesson.
#pragma once
#include <cstdint>

#include "gpu/cuda_util.h"
#include "core/dropout.h"
#include "core/score_mod.h"
#include "core/stage.h"

namespace fa {

struct ModParams;

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
  const ModParams* mods;  // score modifiers, in device memory; nullptr without (below)
};

// Score modifiers and masks (core/score_mod.h), as the kernels compiled with them (kMods) read them: from
// device memory, through one pointer of AttnParams. (Held in AttnParams itself, these 88 bytes would push
// the parameter block past the size up to which the compiler keeps it in registers, and change the code
// of every plain kernel.)
struct ModParams {
  ScoreMod mod;       // causal, input_pos, ALiBi (mod.slopes: a device array [Hq]), softcap, window
  const float* bias;  // [B or 1, Hq or 1, Nq, Nk] float32; nullptr: no bias
  int64_t bias_stride_b, bias_stride_h;  // elements between batches and heads of the bias; 0 where broadcast
};

class GpuRunner : public Runner {
 public:
  // Uploads Q, K, V in the problem's dtype, allocates O and LSE and poisons them with NaN.
  GpuRunner(const Problem& p, const Inputs& in);
  Outputs outputs() override;  // synchronises, downloads, returns float32 tensors
  // NaN in O and the LSE again: a test that launches twice sees whether the second launch wrote every element.
  void poison_outputs() {
    o_.poison();
    lse_.poison();
  }

 protected:
  Problem p_;
  DeviceBuffer q_, k_, v_, o_, lse_;
  DeviceBuffer bias_, slopes_, mods_;  // with score modifiers: the bias, ALiBi's slopes (float32), ModParams
  AttnParams params_{};
};

}  // namespace fa
