// FlashAttention, step by step — gpu/platform.h
// The CUDA device as the harness sees it (core/stage.h, Platform): whether one is usable, its name and
// runtime version, and CUDA-event timing with an L2 flush. Every GPU stage points its Stage at this.
#pragma once
#include "core/stage.h"

namespace fa {

const Platform& cuda_platform();

}  // namespace fa
