// FlashAttention, step by step — step 4: the fused, pipelined tensor-core forward (registry entry).
#pragma once
#include "common/stage.h"

namespace fa::step4 {
Stage stage();
}
