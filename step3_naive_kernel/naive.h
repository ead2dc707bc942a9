// FlashAttention, step by step — step 3: the first CUDA kernel (registry entry).
#pragma once
#include "core/stage.h"

namespace fa::step3 {
Stage stage();
}
