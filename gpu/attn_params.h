// FlashAttention, step by step — gpu/attn_params.h
// The kernel parameter block: what every forward kernel reads, passed by value, and the score modifiers it
// points to. Kept apart from the host runner (gpu/gpu_runner.h), so that a kernel header includes only
// what its kernels read: no CUDA runtime calls, no device buffers, no Stage contract.
#pragma once
#include <cstdint>

#include "core/dropout.h"
#include "core/score_mod.h"

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

}  // namespace fa
