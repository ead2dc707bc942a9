// FlashAttention, step by step — gpu/gpu_runner.h
// Scaffolding every GPU stage shares: a Runner that owns the device tensors and fills the kernel
// parameter block (gpu/attn_params.h). A stage derives from GpuRunner and writes only run() (and
// run_backward()): the lesson.
#pragma once
#include "gpu/attn_params.h"
#include "gpu/cuda_util.h"
#include "core/stage.h"

namespace fa {

// The parameter block of p without its tensors and score modifiers: shapes, mask, scale, dropout.
AttnParams attn_params_of(const Problem& p);

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
