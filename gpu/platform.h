// FlashAttention, step by step — gpu/platform.h
// The CUDA device as the harness sees it (core/stage.h, Platform): whether one is usable, its name and
// runtime version, and CUDA-event timing with an L2 flush. Every GPU stage points its Stage at one of these.
#pragma once
#include "core/stage.h"

namespace fa {

// Any GPU from sm_80 on (the reason is "" there): steps 3 and 4's sub-steps 4a-4c.
const Platform& cuda_platform();

// The CUDA platform narrowed to the GPUs whose instructions a stage's kernels need: compute capability
// min_major and up, to max_major (0: no upper end); `needs` says why, in the reason a GPU outside gets.
class NarrowedPlatform final : public Platform {
 public:
  NarrowedPlatform(int min_major, int max_major, const char* needs)
      : min_major_(min_major), max_major_(max_major), needs_(needs) {}
  std::string unavailable_reason() const override;
  std::string device_name() const override;
  std::string runtime_version() const override;
  int compute_capability_major() const override;
  double time_ms(const std::function<void()>& work, bool cold_l2) const override;

 private:
  int min_major_, max_major_;
  const char* needs_;
};

// sm_90 and later (TMA, mbarrier transaction counts): steps 5 and 6, whose every kernel loads through TMA.
const Platform& tma_platform();

}  // namespace fa
