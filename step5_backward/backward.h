// FlashAttention, step by step — step 5: the backward pass on tensor cores (registry entry).
#pragma once
#include "common/stage.h"

namespace fa::step5 {

Stage stage();

}  // namespace fa::step5
